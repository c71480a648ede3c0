"""Async load generator: open-loop arrivals at a target rate, a concurrency cap, one record per request.

This reproduces how serving benchmarks measure latency against load (vLLM `benchmarks/serve.py`):

- Arrivals are an open-loop process: inter-arrival gaps are gamma distributed with shape
  `burstiness` and mean `1 / rate` (shape 1 is a Poisson process; below 1 is burstier, above 1
  smoother). The schedule is drawn before the clock starts, so a slow engine cannot slow the
  arrivals down; only the concurrency cap (64 by default) holds requests back in the client.
- Every request is built before the clock starts from a deterministic workload
  (`workbench.engines.workloads`), with a unique prompt per request index, so every engine sees the
  same prompts and no request reuses another's prefix.
- One `RequestRecord` per request: scheduled arrival, sent (after the cap), first result where the
  engine reports one, done, success, error, prompt tokens and beams/candidates returned. Failures
  (engine errors, exceptions, timeouts) are records with `success=False`; nothing is dropped.
- Warm-up requests run first and are kept apart (`phase="warmup"`); the unloaded latency is
  measured with requests sent one at a time (`phase="unloaded"`); load points are `phase="load"`.
- A point stops sending at its time cap; requests not sent by then are counted (`not_sent`), requests
  in flight finish or fail at `request_timeout_s`.
- The client measures its own CPU use (process CPU and the event-loop thread's CPU over wall
  time) and how late it sent each request against its schedule, so a saturated client shows up in
  the numbers instead of being mistaken for a slow engine. With an in-process engine the process
  CPU includes the engine; the event-loop share and the send lag are then the client's signal.

Metrics over the records (percentiles, throughput, goodput, saturation QPS) live in `metrics.py`.
The engine is anything with the `Engine` protocol of `engines/base.py`: in-process or an HTTP client.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from workbench.engines.base import BeamSearchRequest, ScoreRequest
from workbench.load.metrics import bracket, point_holds, summarize_point

Request = BeamSearchRequest | ScoreRequest


class RequestSource(Protocol):
    """What the load generator needs from a workload: a deterministic request per index."""

    kind: str  # "beam_search" | "scoring"

    def request(self, index: int) -> Request: ...


TIMEOUT_ERROR = "timeout:"  # how a record that ran out of time begins its error (bench tells it from a dead engine)

@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it. Times are seconds relative to the start of its phase/point."""

    index: int  # request index in the workload (unique prompt per index)
    phase: str  # "warmup" | "unloaded" | "load"
    offered_qps: float  # the rate point (0.0 for warm-up and unloaded requests)
    scheduled: float  # arrival time drawn by the arrival process
    sent: float  # handed to the engine (after waiting for the concurrency cap)
    first_result: float | None  # end of prefill / first token, where the engine reports it
    done: float
    success: bool
    error: str | None
    prompt_tokens: int
    width: int  # beams returned (beam search) or candidates scored (scoring)

    @property
    def e2e_s(self) -> float:
        return self.done - self.sent

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_result is None else self.first_result - self.sent

    @property
    def send_lag_s(self) -> float:
        """How late the request left the client against its scheduled arrival (cap wait included)."""
        return self.sent - self.scheduled


@dataclass
class PointResult:
    """Everything measured at one offered rate."""

    offered_qps: float
    records: list[RequestRecord]
    not_sent: int  # requests the time cap stopped before they were sent
    wall_s: float  # from the first scheduled arrival to the last completion
    client_cpu_s: float  # process CPU time (user + system) during the point
    loop_cpu_s: float  # CPU time of the event-loop thread (the client's own work)
    hit_time_cap: bool = False


@dataclass
class SweepSettings:
    """Knobs of one sweep; `bench.py` fills them from the config's `load` section."""

    requests_per_rate: int = 1000
    warmup_requests: int = 8
    unloaded_requests: int = 10
    concurrency: int = 64
    burstiness: float = 1.0
    time_cap_s: float = 600.0
    request_timeout_s: float = 300.0
    rates: tuple[float, ...] | None = None  # fixed grid; None: adaptive geometric grid
    max_rates: int = 6
    grid_factor: float = 2.0  # growth of the adaptive grid while every point holds the SLO
    grid_resolution: float = 1.15  # stop bisecting when the bad/good rate ratio is below this
    start_load: float = 0.5  # first adaptive rate = start_load / unloaded p50 (a fraction of serial capacity)
    seed: int = 0
    progress: bool = True


@dataclass
class SweepResult:
    warmup: list[RequestRecord] = field(default_factory=list)
    unloaded: list[RequestRecord] = field(default_factory=list)
    points: list[PointResult] = field(default_factory=list)


# ---- arrivals -----------------------------------------------------------------------------------


def arrival_intervals(rate: float, n: int, burstiness: float = 1.0,
                      rng: np.random.Generator | None = None) -> np.ndarray:
    """`n` inter-arrival gaps (seconds) with mean 1/rate: gamma(shape=burstiness, scale=1/(rate*burstiness)).

    Variance is 1 / (rate^2 * burstiness); `burstiness=1` gives exponential gaps (Poisson arrivals).
    `rate=inf` sends everything at once (all gaps 0).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if burstiness <= 0:
        raise ValueError(f"burstiness (gamma shape) must be > 0, got {burstiness}")
    if math.isinf(rate):
        return np.zeros(n)
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s (or inf), got {rate}")
    rng = rng if rng is not None else np.random.default_rng()
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def arrival_times(rate: float, n: int, burstiness: float = 1.0, rng: np.random.Generator | None = None) -> np.ndarray:
    """Arrival offsets from the start of a point; the first request arrives at 0."""
    gaps = arrival_intervals(rate, n, burstiness, rng)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else gaps


# ---- one request --------------------------------------------------------------------------------


def _process_cpu_s() -> float:
    """User + system CPU seconds of this process, all its threads (the standard library's clock: no psutil, which
    the GPU probe's bare image lacks)."""
    return time.process_time()


async def _call_engine(engine, req: Request):
    """Send one request; returns (result, width). The engine's own errors come back in the result."""
    if isinstance(req, BeamSearchRequest):
        res = (await engine.beam_search([req]))[0]
        return res, len(res.beams)
    res = (await engine.score([req]))[0]
    return res, len(res.scores)


async def send_one(engine, req: Request, *, t0: float, scheduled: float, phase: str, offered_qps: float,
                   index: int, timeout_s: float) -> RequestRecord:
    """Send `req` now and turn whatever happens (result, engine error, exception, timeout) into a record."""
    sent = time.perf_counter()
    first = None
    width = 0
    error = None
    try:
        res, width = await asyncio.wait_for(_call_engine(engine, req), timeout=timeout_s)
        done = time.perf_counter()
        success = bool(res.success)
        if not success:
            error = res.error or "engine reported failure without a message"
        tm = res.timings
        if tm is not None and tm.first_token is not None and tm.submitted:
            # engine-side prefill time, placed on the client's clock (clamped into [sent, done])
            first = min(max(sent + (tm.first_token - tm.submitted), sent), done)
    except asyncio.TimeoutError:
        done, success, error = time.perf_counter(), False, f"{TIMEOUT_ERROR} no result within {timeout_s:g} s"
    except Exception as e:  # noqa: BLE001 - a failing request is a record, never a crashed sweep
        done, success, error = time.perf_counter(), False, f"{type(e).__name__}: {e}"[:500]
    return RequestRecord(
        index=index, phase=phase, offered_qps=offered_qps, scheduled=scheduled, sent=sent - t0,
        first_result=None if first is None else first - t0, done=done - t0, success=success, error=error,
        prompt_tokens=len(req.prompt.token_ids), width=width,
    )  # fmt: skip


# ---- phases -------------------------------------------------------------------------------------


async def warm_up(engine, source: RequestSource, n: int, *, first_index: int, concurrency: int = 8,
                  timeout_s: float = 300.0) -> list[RequestRecord]:
    """`n` requests in waves of `concurrency`; they warm caches/compilation and are excluded from metrics."""
    out: list[RequestRecord] = []
    t0 = time.perf_counter()
    for start in range(0, n, max(1, concurrency)):
        idx = range(first_index + start, first_index + min(n, start + concurrency))
        coros = [send_one(engine, source.request(i), t0=t0, scheduled=time.perf_counter() - t0, phase="warmup",
                          offered_qps=0.0, index=i, timeout_s=timeout_s) for i in idx]  # fmt: skip
        out += await asyncio.gather(*coros)
    return out


async def measure_unloaded(engine, source: RequestSource, n: int, *, first_index: int,
                           timeout_s: float = 300.0) -> list[RequestRecord]:
    """`n` requests one at a time (nothing else in flight): the engine's unloaded latency."""
    out = []
    t0 = time.perf_counter()
    for i in range(first_index, first_index + n):
        req = source.request(i)
        out.append(await send_one(engine, req, t0=t0, scheduled=time.perf_counter() - t0, phase="unloaded",
                                  offered_qps=0.0, index=i, timeout_s=timeout_s))  # fmt: skip
    return out


async def run_point(engine, source: RequestSource, rate: float, *, n_requests: int, first_index: int,
                    concurrency: int = 64, burstiness: float = 1.0, time_cap_s: float = 600.0,
                    request_timeout_s: float = 300.0, seed: int = 0, progress: bool = False) -> PointResult:
    """Offer `n_requests` at `rate` (open loop, capped at `concurrency` in flight) and record each one."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    rng = np.random.default_rng([seed, int(first_index)])
    arrivals = arrival_times(rate, n_requests, burstiness, rng)
    reqs = [source.request(first_index + i) for i in range(n_requests)]  # built before the clock starts
    sem = asyncio.Semaphore(concurrency)
    bar = _bar(n_requests, f"{rate:.3g} req/s", progress)
    state = {"capped": False}

    async def one(i: int, at: float) -> RequestRecord | None:
        async with sem:
            if time.perf_counter() - t0 > time_cap_s:
                state["capped"] = True
                return None  # the cap was reached while this one waited for a slot: never sent
            rec = await send_one(engine, reqs[i], t0=t0, scheduled=float(at), phase="load", offered_qps=rate,
                                 index=first_index + i, timeout_s=request_timeout_s)  # fmt: skip
        if bar is not None:
            bar.update(1)
        return rec

    cpu0, loop0 = _process_cpu_s(), time.thread_time()
    t0 = time.perf_counter()
    tasks = []
    for i, at in enumerate(arrivals):
        if at > time_cap_s:  # due after the cap: stop now rather than idle until then (that idle time would
            state["capped"] = True  # count in wall_s and deflate the achieved rate of slow, low-rate points)
            break
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.perf_counter() - t0 > time_cap_s:
            state["capped"] = True
            break
        tasks.append(asyncio.create_task(one(i, at)))
    results = await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    cpu, loop_cpu = _process_cpu_s() - cpu0, time.thread_time() - loop0
    if bar is not None:
        bar.close()
    records = [r for r in results if r is not None]
    return PointResult(
        offered_qps=rate, records=records, not_sent=n_requests - len(records), wall_s=wall,
        client_cpu_s=cpu, loop_cpu_s=loop_cpu, hit_time_cap=state["capped"],
    )  # fmt: skip


def _bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from workbench.progress import progress

    return progress(total=total, desc=desc, unit="req")


# ---- the rate grid ------------------------------------------------------------------------------


def next_adaptive_rate(history: Sequence[tuple[float, bool]], first_rate: float, *, factor: float = 2.0,
                       max_rates: int = 6, resolution: float = 1.15) -> float | None:
    """The next offered rate of an adaptive geometric grid, or None when the sweep is done.

    `history` holds (offered rate, held) per point so far, where "held" means the point kept p99
    inside the SLO, had no failures and achieved most of its offered rate. While every point holds,
    the rate grows by `factor`; while none does, it shrinks by `factor`; once a held rate lies below
    a broken one, the geometric midpoint of the tightest such pair is tried, until the pair is
    within `resolution` of each other or `max_rates` points have run.
    """
    if factor <= 1:
        raise ValueError(f"grid factor must be > 1, got {factor}")
    if len(history) >= max_rates:
        return None
    if not history:
        return first_rate
    lo, hi = bracket(history)
    if lo is None:
        return min(r for r, _ in history) / factor
    if hi is None:  # every rate held, or only rates below a higher held one broke (noise): keep probing upward
        return lo * factor
    if hi / lo <= resolution:
        return None
    return math.sqrt(lo * hi)


async def run_sweep(engine, source: RequestSource, settings: SweepSettings, *, slo_ms: float, first_rate: float,
                    first_index: int = 0,
                    on_point: Callable[[int, PointResult], None] | None = None) -> list[PointResult]:
    """Run the rate points (fixed `settings.rates` or the adaptive grid); `on_point` sees each as it ends."""
    points: list[PointResult] = []
    history: list[tuple[float, bool]] = []
    fixed = list(settings.rates) if settings.rates else None
    index = first_index
    while True:
        if fixed is not None:
            if len(points) >= len(fixed):
                break
            rate = float(fixed[len(points)])
        else:
            rate = next_adaptive_rate(history, first_rate, factor=settings.grid_factor, max_rates=settings.max_rates,
                                      resolution=settings.grid_resolution)  # fmt: skip
            if rate is None:
                break
        point = await run_point(
            engine, source, rate, n_requests=settings.requests_per_rate, first_index=index,
            concurrency=settings.concurrency, burstiness=settings.burstiness, time_cap_s=settings.time_cap_s,
            request_timeout_s=settings.request_timeout_s, seed=settings.seed, progress=settings.progress,
        )  # fmt: skip
        index += settings.requests_per_rate
        points.append(point)
        history.append((rate, point_holds(summarize_point(point, slo_ms=slo_ms), slo_ms)))
        if on_point is not None:
            on_point(len(points) - 1, point)
    return points


def records_table(records: Sequence[RequestRecord]):
    """Records as a pandas DataFrame (one row per request), for artifacts and notebooks."""
    import pandas as pd

    cols = [f.name for f in RequestRecord.__dataclass_fields__.values()]
    df = pd.DataFrame([asdict(r) for r in records], columns=cols)
    df["e2e_ms"] = (df["done"] - df["sent"]) * 1e3
    return df
