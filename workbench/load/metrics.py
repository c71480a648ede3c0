"""Load metrics from per-request records: percentiles, throughput, goodput and the saturation QPS.

The saturation QPS is defined here, once, for the whole workbench:

    the highest ACHIEVED request rate among the rate points whose p99 end-to-end latency is
    inside the SLO and that had no failures.

The grid of rates resolves it only so far. `grid_bracket` gives the offered rates the grid ended between: the
highest whose point held and the lowest above it whose point broke. The saturation QPS is an *achieved* rate: it
carries the arrivals' randomness (60 Poisson arrivals: about +-13% around the offered rate) and a held point may
achieve as little as MIN_ACHIEVED_SHARE of its offered rate, so it may lie above the rate that broke or below the
one that held (both seen, 2026-12-02). Two sweeps (a ratio of two engines, a rerun) differ decisively only where their
brackets do not overlap: a ratio of 1.3x read off a grid of 1.4x steps decides nothing.

The SLO defaults to `DEFAULT_SLO_MULTIPLE` (5x) the reference engine's unloaded p50 (requests sent
one at a time), and every run states the SLO it used. Percentiles use numpy's linear interpolation
over the successful requests of a point; failures are counted separately (a point with any failure
never counts towards saturation). Throughput is successful requests over the point's wall time
(first arrival to last completion); goodput counts only those that finished inside the SLO.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np

from workbench import names

DEFAULT_SLO_MULTIPLE = 5.0
# A point "holds" for the adaptive grid only if it also achieves this share of its offered rate
# (below it, requests queue in the client behind the concurrency cap: the engine is saturated).
MIN_ACHIEVED_SHARE = 0.8


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100, linear interpolation); NaN for no values."""
    v = np.asarray(list(values), dtype=float)
    if v.size == 0:
        return float("nan")
    return float(np.percentile(v, q))


@dataclass(frozen=True)
class PointMetrics:
    """The summary of one rate point (all latencies in milliseconds)."""

    offered_qps: float
    achieved_qps: float  # successful requests / wall time
    requests: int  # measured requests sent (warm-up excluded)
    failures: int
    not_sent: int  # stopped by the time cap before being sent
    e2e_p50_ms: float
    e2e_p90_ms: float
    e2e_p99_ms: float
    e2e_mean_ms: float
    ttft_p50_ms: float  # NaN where the engine reports no first result
    ttft_p99_ms: float
    goodput_qps: float  # successful requests inside the SLO / wall time (NaN without an SLO)
    wall_s: float
    client_cpu_share: float  # process CPU seconds per wall second (1.0 = one core busy)
    loop_cpu_share: float  # event-loop thread CPU per wall second (the client's own work)
    send_lag_p99_ms: float  # lateness against the arrival schedule (includes the concurrency-cap wait)

    def as_metrics(self) -> dict[str, float]:
        """MLflow metric names (see names.py) -> values; NaN values are dropped by the logger."""
        return {key: float(getattr(self, col)) for col, key in METRIC_NAMES.items()}

    def to_dict(self) -> dict:
        return asdict(self)


# Metric names only this module produces (the shared ones live in names.py).
E2E_MEAN = "latency/e2e_mean_ms"
NOT_SENT = "load/not_sent"
REQUESTS = "load/requests"
LOOP_CPU = "load/client_loop_cpu_share"
SEND_LAG_P99 = "load/send_lag_p99_ms"
WALL_S = "load/wall_s"
UNLOADED_P50 = "latency/unloaded_p50_ms"
UNLOADED_P99 = "latency/unloaded_p99_ms"
SLO_MS = "load/slo_ms"
# PointMetrics field -> MLflow metric name (logged per rate point as steps; report.py reads them back)
METRIC_NAMES: dict[str, str] = {
    "offered_qps": names.OFFERED_RATE,
    "achieved_qps": names.THROUGHPUT,
    "requests": REQUESTS,
    "failures": names.FAILURES,
    "not_sent": NOT_SENT,
    "e2e_p50_ms": names.E2E_P50,
    "e2e_p90_ms": names.E2E_P90,
    "e2e_p99_ms": names.E2E_P99,
    "e2e_mean_ms": E2E_MEAN,
    "ttft_p50_ms": names.TTFT_P50,
    "ttft_p99_ms": names.TTFT_P99,
    "goodput_qps": names.GOODPUT,
    "wall_s": WALL_S,
    "client_cpu_share": names.CLIENT_CPU,
    "loop_cpu_share": LOOP_CPU,
    "send_lag_p99_ms": SEND_LAG_P99,
}
POINT_FIELDS = tuple(PointMetrics.__dataclass_fields__)


def summarize_records(records: Iterable, offered_qps: float, wall_s: float, *, slo_ms: float | None = None,
                      not_sent: int = 0, client_cpu_s: float = float("nan"),
                      loop_cpu_s: float = float("nan")) -> PointMetrics:
    """Summarize the records of one point (records of other phases are ignored by the caller)."""
    recs = list(records)
    ok = [r for r in recs if r.success]
    e2e_ms = [(r.done - r.sent) * 1e3 for r in ok]
    ttft_ms = [(r.first_result - r.sent) * 1e3 for r in ok if r.first_result is not None]
    lag_ms = [(r.sent - r.scheduled) * 1e3 for r in recs]
    wall = max(wall_s, 1e-9)
    good = float("nan") if slo_ms is None else sum(1 for x in e2e_ms if x <= slo_ms) / wall
    return PointMetrics(
        offered_qps=float(offered_qps),
        achieved_qps=len(ok) / wall,
        requests=len(recs),
        failures=len(recs) - len(ok),
        not_sent=int(not_sent),
        e2e_p50_ms=percentile(e2e_ms, 50),
        e2e_p90_ms=percentile(e2e_ms, 90),
        e2e_p99_ms=percentile(e2e_ms, 99),
        e2e_mean_ms=float(np.mean(e2e_ms)) if e2e_ms else float("nan"),
        ttft_p50_ms=percentile(ttft_ms, 50),
        ttft_p99_ms=percentile(ttft_ms, 99),
        goodput_qps=good,
        wall_s=float(wall_s),
        client_cpu_share=client_cpu_s / wall,
        loop_cpu_share=loop_cpu_s / wall,
        send_lag_p99_ms=percentile(lag_ms, 99),
    )


def summarize_point(point, slo_ms: float | None = None) -> PointMetrics:
    """`summarize_records` for a `loadgen.PointResult`."""
    return summarize_records(
        point.records, point.offered_qps, point.wall_s, slo_ms=slo_ms, not_sent=point.not_sent,
        client_cpu_s=point.client_cpu_s, loop_cpu_s=point.loop_cpu_s,
    )  # fmt: skip


def within_slo(m: PointMetrics, slo_ms: float) -> bool:
    """The saturation criterion of one point: some requests, no failures, p99 inside the SLO."""
    return m.requests > 0 and m.failures == 0 and math.isfinite(m.e2e_p99_ms) and m.e2e_p99_ms <= slo_ms


def point_holds(m: PointMetrics, slo_ms: float) -> bool:
    """For the adaptive grid: inside the SLO and the engine kept up with the offered rate."""
    return within_slo(m, slo_ms) and m.achieved_qps >= MIN_ACHIEVED_SHARE * m.offered_qps


def saturation_qps(points: Iterable[PointMetrics], slo_ms: float) -> float | None:
    """The highest achieved rate among points inside the SLO with no failures; None if no point qualifies."""
    ok = [p.achieved_qps for p in points if within_slo(p, slo_ms)]
    return max(ok) if ok else None


def bracket(history: Iterable[tuple[float, bool]]) -> tuple[float | None, float | None]:
    """(lo, hi) of (offered rate, held) pairs: the highest rate that held and the lowest rate above it that did not
    (None where no rate held, or none above it broke). The adaptive grid bisects this pair (loadgen)."""
    hist = list(history)
    held = [r for r, ok in hist if ok]
    lo = max(held) if held else None
    broke = [r for r, ok in hist if not ok and (lo is None or r > lo)]
    return lo, (min(broke) if broke else None)


def grid_bracket(points: Iterable[PointMetrics], slo_ms: float) -> tuple[float | None, float | None]:
    """The offered rates a sweep ended between: the highest whose point held (`point_holds`: inside the SLO, no
    failure, the engine kept up) and the lowest above it whose point did not. The grid's resolution, not a
    confidence interval: a rerun of a point can land on either side of the SLO."""
    return bracket((p.offered_qps, point_holds(p, slo_ms)) for p in points)


def default_slo_ms(reference_unloaded_p50_ms: float, multiple: float = DEFAULT_SLO_MULTIPLE) -> float:
    """The default latency SLO: `multiple` x the reference engine's unloaded p50."""
    if not (math.isfinite(reference_unloaded_p50_ms) and reference_unloaded_p50_ms > 0):
        raise ValueError(
            f"cannot derive an SLO from an unloaded p50 of {reference_unloaded_p50_ms} ms (did every unloaded "
            "request fail?); set load.slo_ms in the config"
        )
    return multiple * reference_unloaded_p50_ms


def points_table(points: Sequence[PointMetrics]):
    """PointMetrics as a pandas DataFrame, one row per rate point."""
    import pandas as pd

    return pd.DataFrame([p.to_dict() for p in points], columns=list(POINT_FIELDS))
