"""`scripts/gpu_probe.sh OUTDIR`: the torch engine at the seeds' shape on a GPU host, every phase under one deadline.

Why one prepared command: GPU hosts are lent rarely and for minutes, with a bare image (Python, torch with CUDA,
transformers, numpy/pandas/pyarrow/scipy; no MLflow, plotly, FastAPI, vLLM; no network). So this module imports
only torch, transformers, numpy and workbench modules that import nothing heavier (tests/test_gpu_probe.py checks
the process's modules after a run), builds its models in memory on the device (`random_checkpoint.random_model`:
no 7 GB checkpoint written first), and keeps what it has measured whatever happens next: OUTDIR/probe.json is
rewritten after every phase (a temporary file renamed over it, so a reader never sees half of one), and a phase that
fails is recorded as an error with its message while the next ones still run.

The phases, in order (`PHASES`; each is estimated before it starts and skipped, with the reason, when it would
not fit before the deadline, or when a phase it needs did not run):

1. device: what the device is (GPU model, memory, compute capability, driver, torch, CUDA) and its ceilings: the
   bfloat16 GEMM rate at 8192^3 timed with CUDA events, the copy bandwidth host -> device and back (pinned), and
   device -> device (its memory's bandwidth).
2. parity: the torch engine vs the hf baseline, both on the device, in float32 and bfloat16, on a small random
   checkpoint: `engines/parity.compare_engines` with the bounds the parity tests derive (engines/numerics.py).
3. seeds_shape: the seeds' request (prompt 2000, beam 30, 5 new tokens, Qwen3-1.7B's shape, bfloat16). Its
   compute floor (FLOPs from model/flops.py over the GEMM rate of phase 1) is written to the JSON before any
   request runs, so the measurement tests a prediction; then unloaded requests, unconstrained (the floor's
   request, with the prefill / decode split) and constrained to the catalog (the recommender's).
4. capacity: closed loop, 64 requests in flight (constrained), the achieved request rate.
5. sweep: a short Poisson sweep at fractions of that capacity; the SLO is 5x the unloaded p50 (load/metrics.py's
   default), the saturation QPS load/metrics.py's definition.
6. scoring: 500 candidates of 5 tokens against a prompt of 2000, one pass, vs its own compute floor.
7. training: training steps' tokens/s on the same model shape (float32 weights, bfloat16 autocast, AdamW), with
   their FLOPs (model/flops.py) over the GEMM rate.

`--plan` prints the phases with their estimates and runs nothing (no torch import); `--cpu-smoke` runs every phase
at tiny sizes on the CPU (the 1.7B replaced by the 0.1m size) in well under a minute: the suite runs it. Output:
probe.json and probe.log (what was printed) in OUTDIR, nothing else; the JSON ends with the third-party modules
the run imported (`third_party_modules`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

_STARTED = time.monotonic()  # `main`'s deadline counts from the import of this module (before torch's)

JSON_FILE = "probe.json"
LOG_FILE = "probe.log"
SCHEMA = 1


@dataclass(frozen=True)
class ProbeShape:
    """Every size the probe uses: `GPU` is the seeds' shape on a CUDA device, `SMOKE` the same phases tiny on the
    CPU. `estimates` are each phase's seconds (what `--plan` prints and the deadline check compares)."""

    mode: str
    device: str
    size: str  # random_checkpoint.SIZES name of the served model
    dtype: str = "bfloat16"
    prompt: int = 2000
    beam: int = 30
    new_tokens: int = 5  # also the SID depth of the random catalog (4 levels + the dedup digit)
    n_items: int = 10_000
    levels: tuple[int, ...] = (32, 32, 32, 32)
    max_batch_tokens: int = 16_384
    gemm_n: int = 8192
    copy_mib: int = 1024
    unloaded_requests: int = 10
    in_flight: int = 64
    capacity_requests: int = 320
    capacity_cap_s: float = 45.0
    sweep_fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    sweep_point_s: float = 15.0
    candidates: int = 500
    candidate_tokens: int = 5
    score_requests: int = 5
    train_batch: int = 8
    train_seq: int = 512
    train_steps: int = 3
    deadline_s: float = 480.0
    estimates: dict = field(default_factory=dict)


GPU = ProbeShape(mode="gpu", device="cuda", size="1.7b", estimates={
    "device": 20, "parity": 45, "seeds_shape": 60, "capacity": 60, "sweep": 85, "scoring": 30, "training": 50})
SMOKE = replace(
    GPU, mode="cpu-smoke", device="cpu", size="0.1m", prompt=48, beam=4, n_items=200, levels=(4, 4, 4, 4),
    max_batch_tokens=2048, gemm_n=256, copy_mib=8, unloaded_requests=3, in_flight=8, capacity_requests=24,
    capacity_cap_s=5.0, sweep_fractions=(0.5, 1.0), sweep_point_s=1.0, candidates=40, score_requests=2,
    train_batch=2, train_seq=32, train_steps=2, deadline_s=60.0,
    estimates={"device": 2, "parity": 12, "seeds_shape": 5, "capacity": 5, "sweep": 5, "scoring": 3, "training": 4})


@dataclass(frozen=True)
class Phase:
    name: str
    what: str  # one line: what it measures
    run: Callable[["Probe"], dict]
    needs: tuple[str, ...] = ()  # phases that must have run (status ok) first


class Probe:
    """The run: its shape, the JSON document it rewrites after every phase, the live objects phases hand on."""

    def __init__(self, shape: ProbeShape, outdir: Path, phases: list[Phase], deadline_s: float | None = None,
                 started: float | None = None):
        """`started`: the time.monotonic() the deadline counts from (default: now)."""
        self.shape, self.outdir, self.phases = shape, Path(outdir), phases
        self.deadline_s = float(shape.deadline_s if deadline_s is None else deadline_s)
        self.started = time.monotonic() if started is None else float(started)
        self.state: dict = {}  # engine, checkpoint, workloads, measured numbers later phases read
        self.doc = {
            "probe": "workbench GPU probe (workbench/perf/gpu_probe.py)", "schema": SCHEMA, "mode": shape.mode,
            "commit": _commit(), "started": _now(), "updated": _now(), "deadline_s": self.deadline_s,
            "elapsed_s": 0.0, "shape": {k: v for k, v in asdict(shape).items() if k != "estimates"},
            "versions": _versions(),
            "phases": {p.name: {"status": "pending", "what": p.what, "estimate_s": self.estimate(p), "reason": None,
                                "elapsed_s": None, "result": {}} for p in phases},
        }  # fmt: skip

    def estimate(self, phase: Phase) -> float:
        return float(self.shape.estimates.get(phase.name, 10.0))

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def log(self, msg: str) -> None:
        line = f"[probe {self.elapsed():6.1f}s] {msg}"
        print(line, flush=True)
        with open(self.outdir / LOG_FILE, "a") as f:
            f.write(line + "\n")

    def save(self) -> None:
        """Rewrite probe.json: the whole document to a temporary file, then renamed over the old one (atomic)."""
        self.doc["updated"], self.doc["elapsed_s"] = _now(), round(self.elapsed(), 2)
        tmp = self.outdir / (JSON_FILE + ".tmp")
        tmp.write_text(json.dumps(_finite(self.doc), indent=1, default=_jsonable, allow_nan=False))
        os.replace(tmp, self.outdir / JSON_FILE)

    def result(self, name: str) -> dict:
        return self.doc["phases"][name]["result"]

    def run(self) -> dict:
        self.outdir.mkdir(parents=True, exist_ok=True)
        (self.outdir / LOG_FILE).unlink(missing_ok=True)
        self.log(f"{self.shape.mode}: {len(self.phases)} phases, deadline {self.deadline_s:.0f} s, "
                 f"output {self.outdir}")
        self.save()
        for phase in self.phases:
            entry = self.doc["phases"][phase.name]
            why = self._why_skip(phase, entry["estimate_s"])
            if why is not None:
                entry.update(status="skipped", reason=why)
                self.log(f"{phase.name}: skipped ({why})")
                self.save()
                continue
            entry["status"] = "running"
            self.log(f"{phase.name}: {phase.what} (estimate {entry['estimate_s']:.0f} s)")
            self.save()
            t0 = time.monotonic()
            try:
                entry["result"].update(phase.run(self) or {})
                entry["status"] = "ok"
            except Exception as e:  # noqa: BLE001 - a failed phase is a record; the next phases still run
                entry.update(status="error", reason=f"{type(e).__name__}: {e}"[:2000],
                             traceback=traceback.format_exc()[-4000:])
                _free_device_memory()
            entry["elapsed_s"] = round(time.monotonic() - t0, 2)
            self.log(f"{phase.name}: {entry['status']} in {entry['elapsed_s']:.1f} s"
                     + (f" ({entry['reason']})" if entry["reason"] else ""))
            self.save()
        _release_engine(self)
        self.state.clear()
        self.doc["third_party_modules"] = third_party_modules()  # what the image must have (and nothing heavier)
        self.save()
        self.log(f"done: {self.outdir / JSON_FILE}")
        return self.doc

    def _why_skip(self, phase: Phase, estimate: float) -> str | None:
        for need in phase.needs:
            status = self.doc["phases"][need]["status"]
            if status != "ok":
                return f"needs phase {need}, which did not run ({status})"
        left = self.deadline_s - self.elapsed()
        if estimate > left:
            return f"deadline: needs ~{estimate:.0f} s, {max(left, 0):.0f} s left of {self.deadline_s:.0f} s"
        return None


# ---- the phases ---------------------------------------------------------------------------------------------


def phase_device(p: Probe) -> dict:
    """The device, its bf16 GEMM rate (CUDA events) and copy bandwidth host <-> device."""
    import torch

    from workbench.hardware import device_info, device_seconds, is_cuda, sync

    s, dev = p.shape, p.shape.device
    out = {**device_info(dev), "torch": torch.__version__}
    if is_cuda(dev):
        try:  # float32 parity's bound assumes float32 GEMMs (TF32 off: PyTorch's default)
            out["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
        except Exception as e:  # noqa: BLE001 - a newer torch may move the switch; say so instead of failing
            out["tf32_matmul"] = f"unknown ({type(e).__name__})"
    n = s.gemm_n
    a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        a @ b
    sync(dev)
    one = device_seconds(lambda: a @ b, dev)
    reps = max(3, int(0.3 / max(one, 1e-6)))
    best = min(device_seconds(lambda: a @ b, dev, reps) for _ in range(3))
    out.update(gemm_n=n, gemm_dtype="bfloat16", gemm_reps=reps, gemm_tflops=2 * n**3 / best / 1e12)
    del a, b
    nbytes = s.copy_mib * 2**20
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=is_cuda(dev))
    on_dev = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    other = torch.empty_like(on_dev)
    host.fill_(1)
    for direction, fn, moved in (("h2d", lambda: on_dev.copy_(host, non_blocking=True), nbytes),
                                 ("d2h", lambda: host.copy_(on_dev, non_blocking=True), nbytes),
                                 ("d2d", lambda: other.copy_(on_dev), 2 * nbytes)):  # d2d: read + write
        fn()
        sec = min(device_seconds(fn, dev, 3) for _ in range(3))
        out[f"copy_{direction}_gb_s"] = moved / sec / 1e9
    del host, on_dev, other
    out["copy_mib"] = s.copy_mib
    out["copy_note"] = ("pinned host memory, non_blocking copies; d2d counts bytes read + written (the device "
                        "memory's bandwidth, what a decode step's weight reads meet)" if is_cuda(dev)
                        else "host memcpy (no device)")
    p.state["gemm_tflops"] = out["gemm_tflops"]
    p.log(f"  {out['device_name']}: bf16 GEMM {n}^3 {out['gemm_tflops']:.1f} TFLOP/s; copies "
          f"h2d {out['copy_h2d_gb_s']:.1f} GB/s, d2h {out['copy_d2h_gb_s']:.1f} GB/s, "
          f"on the device {out['copy_d2d_gb_s']:.1f} GB/s")
    return out


def phase_parity(p: Probe) -> dict:
    """torch vs hf, both on the device, float32 and bfloat16, on a small random checkpoint (derived bounds)."""
    from workbench.engines.parity import compare_engines
    from workbench.engines.registry import create_engine
    from workbench.model.random_checkpoint import make_random_checkpoint

    out = {}
    with tempfile.TemporaryDirectory(prefix="gpu_probe_parity_") as tmp:  # a few MB, outside OUTDIR
        ck = make_random_checkpoint(Path(tmp) / "ck", n_items=200, levels=(8, 8), hidden_size=64, num_layers=2,
                                    vocab_base=300, soft_token=True)
        for dtype in ("float32", "bfloat16"):
            te = create_engine("torch", ck, dtype=dtype, device=p.shape.device)
            he = create_engine("hf", ck, dtype=dtype, device=p.shape.device)
            try:
                report = asyncio.run(compare_engines(te, he, ck, dtype=dtype))
            finally:
                te.shutdown()
            out[dtype] = report.to_dict()
            cases = ", ".join(f"{c.name} {c.status}" for c in report.cases)
            p.log(f"  {dtype}: {'ok' if report.ok else 'FAILED'} (bound {report.tol:.2e}): {cases}")
    out["ok"] = all(out[d]["ok"] for d in ("float32", "bfloat16"))
    return out


def _served(p: Probe):
    """The seeds' model (built once, in memory, on the device) and the torch engine on it."""
    if "engine" not in p.state:
        from workbench.engines.torch.engine import TorchEngine
        from workbench.model.random_checkpoint import random_model

        s = p.shape
        t0 = time.monotonic()
        ck = random_model(s.size, device=s.device, dtype=s.dtype, n_items=s.n_items, levels=s.levels,
                          soft_token=False, seed=0)
        built = time.monotonic() - t0
        eng = TorchEngine(ck, dtype=s.dtype, device=s.device, max_batch_tokens=s.max_batch_tokens,
                          max_candidates=max(1024, s.candidates))
        p.state.update(checkpoint=ck, engine=eng, build_s=built, engine_s=time.monotonic() - t0 - built)
    return p.state["checkpoint"], p.state["engine"]


def _workload(p: Probe, kind: str, constrained: bool = True):
    from workbench.engines.workloads import SyntheticWorkload, WorkloadShape

    s = p.shape
    shape = WorkloadShape(kind, prompt_tokens=s.prompt, beam_width=s.beam, max_new_tokens=s.new_tokens,
                          constrained=constrained, candidates=s.candidates, candidate_tokens=s.candidate_tokens)
    return SyntheticWorkload.from_checkpoint(shape, p.state["checkpoint"], soft_token=False)


def _ms(values) -> dict:
    from workbench.load.metrics import percentile

    v = [float(x) for x in values]
    return {"p50": percentile(v, 50), "p90": percentile(v, 90), "min": min(v), "max": max(v), "n": len(v)}


def phase_seeds_shape(p: Probe) -> dict:
    """The predicted floor first (written before any request), then unloaded requests against it."""
    from workbench.load.loadgen import measure_unloaded
    from workbench.model.flops import beam_request_flops
    from workbench.perf.floorbench import engine_times

    s = p.shape
    ck, eng = _served(p)
    cfg = ck.model.config
    by_phase = beam_request_flops(cfg, s.prompt, s.beam, s.new_tokens)
    flop = sum(by_phase.values())
    tflops = p.state["gemm_tflops"]
    res = p.result("seeds_shape")
    res.update(model={"size": s.size, "parameters": sum(t.numel() for t in ck.model.parameters()),
                      "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
                      "kv_heads": cfg.num_key_value_heads, "vocab": cfg.vocab_size, "dtype": s.dtype},
               build_s=p.state["build_s"], engine_load_s=p.state["engine_s"], gemm=eng.lm.gemm,
               kv_bytes_per_token=eng.lm.kv_bytes_per_token(),
               predicted={"flop": flop, "flop_by_phase": by_phase, "gemm_tflops": tflops,
                          "floor_ms": flop / (tflops * 1e12) * 1e3,
                          "note": "written before any request ran: FLOPs (model/flops.py) / the GEMM rate measured "
                                  "in phase device"})
    p.save()  # the prediction is on disk before the measurement of it
    p.log(f"  predicted floor {res['predicted']['floor_ms']:.2f} ms/request ({flop / 1e12:.3f} TFLOP at "
          f"{tflops:.1f} TFLOP/s)")
    free = _workload(p, "beam_search", constrained=False)
    rows = engine_times(eng, free, s.unloaded_requests)  # one warm-up inside
    totals = [r[0] for r in rows]
    unc = {"e2e_ms": _ms(totals), "prefill_forward_ms": _ms(r[1] for r in rows),
           "decode_forwards_ms": _ms(r[2] for r in rows)}
    unc["over_floor_p50"] = unc["e2e_ms"]["p50"] / res["predicted"]["floor_ms"]
    res["unconstrained"] = unc
    cons = _workload(p, "beam_search", constrained=True)
    recs = asyncio.run(measure_unloaded(eng, cons, s.unloaded_requests + 1, first_index=1000))[1:]  # first: warm-up
    failed = [r.error for r in recs if not r.success]
    if failed:
        raise RuntimeError(f"{len(failed)} constrained requests failed, first: {failed[0]}")
    res["constrained"] = {"e2e_ms": _ms(r.e2e_s * 1e3 for r in recs),
                          "ttft_ms": _ms(r.ttft_s * 1e3 for r in recs if r.ttft_s is not None)}
    p.state["unloaded_p50_ms"] = res["constrained"]["e2e_ms"]["p50"]
    p.log(f"  unloaded: unconstrained p50 {unc['e2e_ms']['p50']:.1f} ms ({unc['over_floor_p50']:.2f}x the floor; "
          f"prefill {unc['prefill_forward_ms']['p50']:.1f}, decode {unc['decode_forwards_ms']['p50']:.1f}), "
          f"constrained p50 {p.state['unloaded_p50_ms']:.1f} ms")
    return {}


def phase_capacity(p: Probe) -> dict:
    """Closed loop: every request sent at once, `in_flight` of them at a time; the achieved rate."""
    from workbench.load.loadgen import run_point, warm_up
    from workbench.load.metrics import summarize_point

    s = p.shape
    _, eng = _served(p)
    wl = _workload(p, "beam_search", constrained=True)
    asyncio.run(warm_up(eng, wl, s.in_flight, first_index=2000, concurrency=s.in_flight))
    eng.reset_stats()
    point = asyncio.run(run_point(eng, wl, math.inf, n_requests=s.capacity_requests, first_index=3000,
                                  concurrency=s.in_flight, time_cap_s=s.capacity_cap_s,
                                  request_timeout_s=max(60.0, 4 * s.capacity_cap_s)))
    m = summarize_point(point)
    st = eng.stats
    p.state["capacity_qps"] = m.achieved_qps
    out = {"in_flight": s.in_flight, "metrics": m.to_dict(), "hit_time_cap": point.hit_time_cap,
           "forwards": st.forwards, "rows_per_forward": st.rows / max(st.forwards, 1),
           "busy_share": st.busy_s / max(m.wall_s, 1e-9)}
    p.log(f"  {m.achieved_qps:.2f} req/s at {s.in_flight} in flight (p50 {m.e2e_p50_ms:.0f} ms, p99 "
          f"{m.e2e_p99_ms:.0f} ms, {m.failures} failed, {out['rows_per_forward']:.0f} rows per forward)")
    return out


def phase_sweep(p: Probe) -> dict:
    """Poisson arrivals at fractions of the closed-loop capacity; saturation QPS at 5x the unloaded p50."""
    from workbench.load.loadgen import run_point
    from workbench.load.metrics import default_slo_ms, grid_bracket, saturation_qps, summarize_point

    s = p.shape
    _, eng = _served(p)
    wl = _workload(p, "beam_search", constrained=True)
    slo = default_slo_ms(p.state["unloaded_p50_ms"])
    points, index = [], 10_000
    for frac in s.sweep_fractions:
        rate = frac * p.state["capacity_qps"]
        n = max(8, math.ceil(rate * s.sweep_point_s))
        point = asyncio.run(run_point(eng, wl, rate, n_requests=n, first_index=index, concurrency=s.in_flight,
                                      time_cap_s=2 * s.sweep_point_s, request_timeout_s=max(60.0, 10 * slo / 1e3),
                                      seed=1))
        index += n
        m = summarize_point(point, slo_ms=slo)
        points.append(m)
        p.log(f"  {rate:.2f} req/s offered: {m.achieved_qps:.2f} achieved, p99 {m.e2e_p99_ms:.0f} ms "
              f"(SLO {slo:.0f}), {m.failures} failed")
    sat = saturation_qps(points, slo)
    lo, hi = grid_bracket(points, slo)
    p.log(f"  saturation QPS at the SLO: {sat if sat is None else round(sat, 2)} (grid bracket {lo}, {hi})")
    return {"slo_ms": slo, "slo_rule": "5x the constrained unloaded p50 (load/metrics.default_slo_ms)",
            "points": [m.to_dict() for m in points], "saturation_qps": sat, "grid_bracket": [lo, hi],
            "arrivals": "Poisson (burstiness 1)", "in_flight_cap": s.in_flight}


def phase_scoring(p: Probe) -> dict:
    """Multi-item scoring: `candidates` candidates against one prompt in one pass, vs its compute floor."""
    from workbench.hardware import sync
    from workbench.model.flops import score_request_flops

    s = p.shape
    ck, eng = _served(p)
    wl = _workload(p, "scoring")
    by_phase = score_request_flops(ck.model.config, s.prompt, s.candidates, s.candidate_tokens)
    floor_ms = sum(by_phase.values()) / (p.state["gemm_tflops"] * 1e12) * 1e3
    times = []
    for i in range(s.score_requests + 1):  # the first: warm-up
        req = wl.request(20_000 + i)
        sync(s.device)
        t0 = time.perf_counter()
        (res,) = asyncio.run(eng.score([req]))
        if not res.success:
            raise RuntimeError(f"scoring request failed: {res.error}")
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = _ms(times)
    p.log(f"  {s.candidates} candidates x {s.candidate_tokens} at prompt {s.prompt}: p50 {ms['p50']:.1f} ms "
          f"({ms['p50'] / floor_ms:.2f}x its floor {floor_ms:.2f} ms)")
    return {"candidates": s.candidates, "candidate_tokens": s.candidate_tokens, "ms": ms,
            "candidates_per_s": s.candidates / (ms["p50"] / 1e3), "flop": sum(by_phase.values()),
            "flop_by_phase": by_phase, "floor_ms": floor_ms, "over_floor_p50": ms["p50"] / floor_ms}


def phase_training(p: Probe) -> dict:
    """Training steps on the served model's shape: float32 weights, bf16 autocast, AdamW; tokens/s and MFU."""
    import torch

    from workbench.hardware import is_cuda, sync
    from workbench.model.flops import causal_pairs, train_flops
    from workbench.model.random_checkpoint import random_model

    s = p.shape
    _release_engine(p)
    ck = random_model(s.size, device=s.device, dtype="float32", n_items=s.n_items, levels=s.levels,
                      soft_token=False, seed=1)
    model = ck.model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=is_cuda(s.device))
    g = torch.Generator(device=s.device).manual_seed(0)
    ids = torch.randint(2, ck.meta.layout.base_vocab_size, (s.train_batch, s.train_seq), device=s.device, generator=g)
    kind = "cuda" if is_cuda(s.device) else "cpu"

    def step() -> float:
        with torch.autocast(kind, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    step()  # warm-up: the optimizer's state, the kernels' first calls
    sync(s.device)
    t0 = time.perf_counter()
    losses = [step() for _ in range(s.train_steps)]
    sync(s.device)
    step_s = (time.perf_counter() - t0) / s.train_steps
    tokens = s.train_batch * s.train_seq
    flop = train_flops(model.config, tokens, tokens, None, s.train_batch * causal_pairs(s.train_seq))
    achieved = flop / step_s / 1e12
    out = {"batch": s.train_batch, "seq": s.train_seq, "steps": s.train_steps, "step_s": step_s,
           "tokens_per_s": tokens / step_s, "flop_per_step": flop, "achieved_tflops": achieved,
           "fraction_of_gemm_rate": achieved / p.state["gemm_tflops"], "losses": losses,
           "setup": "float32 weights, bf16 autocast, AdamW (fused on CUDA), loss on every position"}
    if is_cuda(s.device):
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(s.device) / 2**30
    p.log(f"  {out['tokens_per_s']:.0f} tokens/s ({step_s * 1e3:.0f} ms per step of {tokens} tokens; "
          f"{achieved:.1f} TFLOP/s, {out['fraction_of_gemm_rate']:.0%} of the GEMM rate)")
    del model, opt, ck
    _free_device_memory()
    return out


PHASES = [
    Phase("device", "the device and its ceilings: bf16 GEMM rate (CUDA events), copy bandwidth", phase_device),
    Phase("parity", "torch vs hf on the device, float32 and bf16, within the derived bounds", phase_parity),
    Phase("seeds_shape", "the seeds' request unloaded vs its predicted compute floor", phase_seeds_shape,
          needs=("device",)),
    Phase("capacity", "closed loop at the in-flight cap (64 on a GPU): achieved requests/s", phase_capacity,
          needs=("seeds_shape",)),
    Phase("sweep", "Poisson sweep below capacity: saturation QPS at 5x the unloaded p50", phase_sweep,
          needs=("seeds_shape", "capacity")),
    Phase("scoring", "multi-item scoring (500 candidates at prompt 2000 on a GPU), one pass vs its floor",
          phase_scoring, needs=("device", "seeds_shape")),
    Phase("training", "training steps' tokens/s and their share of the GEMM rate", phase_training, needs=("device",)),
]


# ---- helpers ------------------------------------------------------------------------------------------------


def _release_engine(p: Probe) -> None:
    eng = p.state.pop("engine", None)
    if eng is not None:
        eng.shutdown()
    p.state.pop("checkpoint", None)
    _free_device_memory()


def _free_device_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def third_party_modules() -> list[str]:
    """The top-level modules outside the standard library this process has imported (workbench's own left out)."""
    names = {m.split(".")[0] for m in list(sys.modules)}
    return sorted(n for n in names - set(sys.stdlib_module_names) if n != "workbench" and not n.startswith("_"))


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def _commit() -> str:
    from workbench.tracking import git_commit  # MLflow is imported inside its functions, not by this one

    return git_commit()


def _versions() -> dict:
    """Python's and the three packages' versions the probe runs on (`tracking.package_versions`: metadata only)."""
    from workbench.tracking import package_versions  # (MLflow is imported inside its functions, not by this one)

    v = package_versions()
    return {k: v.get(k) for k in ("python", "torch", "transformers", "numpy")}


def _jsonable(x):
    """What json cannot write as is: numpy numbers, tuples' items, torch sizes; NaN/inf become None."""
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return str(x)


def _finite(doc):
    """`doc` with every non-finite float replaced by None (strict JSON: NaN is not JSON)."""
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    return doc


def plan_text(shape: ProbeShape, deadline_s: float) -> str:
    lines = [f"GPU probe, {shape.mode} on {shape.device}: {shape.size} model, prompt {shape.prompt}, "
             f"beam {shape.beam}, {shape.new_tokens} new tokens, {shape.dtype}; deadline {deadline_s:.0f} s",
             f"{'phase':<12} {'estimate s':>10}  needs             what"]
    for ph in PHASES:
        lines.append(f"{ph.name:<12} {shape.estimates.get(ph.name, 10):>10.0f}  {','.join(ph.needs) or '-':<17} "
                     f"{ph.what}")
    total = sum(shape.estimates.get(ph.name, 10) for ph in PHASES)
    lines.append(f"{'total':<12} {total:>10.0f}  (a phase that would end past the deadline is skipped, with the "
                 "reason)")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/gpu_probe.sh", description=__doc__.split("\n")[0])
    p.add_argument("outdir", nargs="?", help="folder for probe.json and probe.log (created)")
    p.add_argument("--plan", action="store_true", help="print the phases and their estimates; run nothing")
    p.add_argument("--cpu-smoke", action="store_true", help="every phase at tiny sizes on the CPU (under a minute)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="seconds from the start for every phase (default 480 on a GPU, 60 for --cpu-smoke)")
    p.add_argument("--device", default=None, help="the CUDA device for the GPU mode (default cuda)")
    args = p.parse_args(argv)
    if not args.plan and not args.outdir:
        p.error("give OUTDIR (or --plan)")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    shape = SMOKE if args.cpu_smoke else GPU
    if args.device:
        shape = replace(shape, device=args.device)
    deadline = shape.deadline_s if args.deadline_s is None else args.deadline_s
    if args.plan:
        print(plan_text(shape, deadline))
        return 0
    from workbench.engines.checks import DeviceError, require_device

    try:
        require_device(shape.device)
    except DeviceError as e:
        print(f"error: {e}; on a machine without a GPU, --cpu-smoke runs every phase tiny on the CPU", file=sys.stderr)
        return 2
    doc = Probe(shape, Path(args.outdir), PHASES, deadline, started=_STARTED).run()
    bad = [n for n, ph in doc["phases"].items() if ph["status"] == "error"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
