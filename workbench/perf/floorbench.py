"""`workbench microbench --floor`: how far one unloaded beam request is from this machine's compute floor, and why.

Issue 6 asks the torch engine's low-load time per request to be within 1.3x of the *compute floor*:
the request's FLOPs over this machine's matmul rate (a square GEMM, the best case for BLAS: 1024^3 on the CPU,
8192^3 on a GPU, `hardware.default_gemm_n`). That floor assumes every FLOP runs at the square-GEMM rate. The
kernels a beam request actually needs do not: a decode step is a GEMM of only `beam` rows, and causal attention
over a 512-token prompt is a chain of thin matmuls plus a softmax. So this benchmark measures, in one process and
side by side:

1. the matmul floor (FLOPs / square-GEMM rate), per phase;
2. the *kernel floor*: the same phases timed as the bare torch kernels the engine calls (every layer's
   GEMMs at the engine's weight shapes and row counts, the engine's causal attention, decode attention), nothing else;
3. the engine: an unloaded request through the real scheduler, its prefill and decode forwards timed.

engine / kernel floor is the engine's own overhead (Python, scheduling, KV bookkeeping, selection);
kernel floor / matmul floor is what these shapes cost on this BLAS, which no scheduler can remove.
Prints a table and, last, one JSON line with every number.

Paired with the matmul rate: these machines share their host, and its load moves every rate by 10-30% over
tens of seconds (the same command, same code, four times in four minutes: bf16 engine 186-252 ms, square-GEMM
rate 378-431 GFLOP/s; AMD EPYC Zen 5, 2026-12-02). A floor measured a minute before the engine can be off by
that much. So, given `sample_rate` (a ~0.1 s measurement of the same GEMM), each engine request is bracketed
by two rate samples and divided by its own floor; `engine_over_matmul_floor` is the median of those paired
ratios (their range is printed too), the phase table uses the median rate.

`microbench.py` builds the checkpoint and measures the matmul rate, then calls `run_floor`; this
module never imports microbench (the dependency runs one way), and draws its requests from the
synthetic workloads of `workbench/engines/workloads.py` like every other benchmark.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.engines.workloads import SyntheticWorkload, WorkloadShape


@dataclass
class Phase:
    name: str
    gflop: float
    matmul_floor_ms: float
    kernel_ms: float


def _best_ms(fn, repeats: int, device=None) -> float:
    """Best of `repeats` timed calls after two warm-up ones, in ms; on a CUDA device each call is waited for
    (hardware.sync: its kernels run asynchronously), the warm-up too, so no call's time includes another's."""
    from workbench.hardware import sync

    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def kernel_times(lm, prompt_len: int, beam: int, new_tokens: int, repeats: int = 5) -> dict[str, float]:
    """Best-of-`repeats` milliseconds of the bare kernels of one beam request, summed over layers and steps."""
    import torch
    import torch.nn.functional as F

    from workbench.engines.torch.layers import MIN_ROWS, matmul
    from workbench.engines.torch.model import BLOCKED_MIN_LEN, causal_attention

    lw = lm.layers[0]  # every layer has the same shapes
    L = len(lm.layers)
    H, Hkv, D, g = lm.n_heads, lm.n_kv, lm.head_dim, lm.group

    def randn(*shape):
        return torch.randn(*shape, dtype=lm.dtype, device=lm.device)

    def best(fn) -> float:
        return _best_ms(fn, repeats, lm.device)

    def gemms(m: int) -> float:
        x, xo, xi = randn(m, lm.hidden), randn(m, H * D), randn(m, lw.w_down.shape[1])

        def run():  # the engine's own GEMM kernels (int8 ones with quantize="int8")
            matmul(x, lw.wqkv)
            matmul(xo, lw.wo)
            matmul(x, lw.w_gate_up)
            matmul(xi, lw.w_down)

        return best(run) * L

    q, k, v = randn(1, H, prompt_len, D), randn(1, Hkv, prompt_len, D), randn(1, Hkv, prompt_len, D)
    if lm.device.type == "cpu" and prompt_len >= BLOCKED_MIN_LEN:  # the engine's choice (torch/model._attend_prefill)
        attn = best(lambda: causal_attention(q[0], k[0], v[0], lm.scale)) * L
    else:
        attn = best(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=lm.scale, enable_gqa=g > 1)) * L
    dec_attn = 0.0
    for t in range(1, new_tokens):  # decode steps: beam x g query rows per KV head over prompt + own tokens
        qd, kd, vd = randn(Hkv, beam * g, D), randn(Hkv, D, prompt_len + t), randn(Hkv, prompt_len + t, D)
        dec_attn += best(lambda: torch.bmm(torch.softmax(torch.bmm(qd, kd) * lm.scale, -1), vd)) * L
    h1 = randn(MIN_ROWS, lm.hidden)  # the prompt's last row: the engine pads GEMMs of fewer rows to MIN_ROWS
    hb = randn(beam, lm.hidden)
    head_prefill = best(lambda: matmul(h1, lm.lm_head))
    head = head_prefill + (new_tokens - 1) * best(lambda: matmul(hb, lm.lm_head))
    return {
        "prefill_gemm": gemms(prompt_len),
        "prefill_attention": attn,
        "decode_gemm": (new_tokens - 1) * gemms(beam),
        "decode_attention": dec_attn,
        "lm_head": head,
        "lm_head_prefill": head_prefill,  # the part of lm_head that belongs to the prefill (not a phase)
    }


def flops(lm, prompt_len: int, beam: int, new_tokens: int) -> dict[str, float]:
    """FLOPs of one beam request by phase, from the engine's model config (model/flops.py's count: the causal
    prefill's query-key pairs are P (P + 1) / 2; the GPU probe predicts its floor with the same count)."""
    from workbench.model.flops import beam_request_flops

    return beam_request_flops(lm.config, prompt_len, beam, new_tokens)


def engine_times(engine, workload: SyntheticWorkload, requests: int, sample_rate=None
                 ) -> list[tuple[float, float, float, float | None]]:
    """Unloaded requests one at a time: per request (total ms, prefill forward ms, decode forwards ms, matmul
    GFLOP/s around it: the mean of `sample_rate()` just before and just after, None without `sample_rate`).
    Each forward is waited for on either side (hardware.sync), so on a CUDA device its time is its kernels', not
    their launch; on the CPU that is a no-op."""
    from workbench.hardware import sync

    lm = engine.lm
    calls: list[float] = []
    orig = lm.forward

    def timed_forward(x, segments, positions=None):
        sync(lm.device)
        t0 = time.perf_counter()
        out = orig(x, segments, positions)
        sync(lm.device)
        calls.append((time.perf_counter() - t0) * 1000)
        return out

    lm.forward = timed_forward
    rows = []
    try:
        for i, req in enumerate(workload.requests(requests + 1)):  # the first is a warm-up
            before = sample_rate() if sample_rate and i else None
            calls.clear()
            t0 = time.perf_counter()
            res = asyncio.run(engine.beam_search([req]))[0]
            total = (time.perf_counter() - t0) * 1000
            if not res.success:
                raise RuntimeError(f"beam request failed: {res.error}")
            if i:
                rate = None if before is None else (before + sample_rate()) / 2
                rows.append((total, calls[0], sum(calls[1:]), rate))
    finally:
        lm.forward = orig
    return rows


def run_floor(checkpoint: Path, peak_gflops: float, *, prompt_len: int, beam: int, new_tokens: int,
              dtype: str = "float32", device: str = "cpu", quick: bool = False, options: dict | None = None,
              sample_rate=None) -> dict:
    """Print the floor table for one unconstrained beam request of this shape on `checkpoint`; `options`: the
    torch engine's (compile, quantize). The matmul floor stays the float rate of `dtype`, also for int8.
    `sample_rate`: a short measurement of the `peak_gflops` GEMM, taken around every request (module doc)."""
    from workbench.engines.registry import create_engine
    from workbench.hardware import default_gemm_n, device_name

    P, B, T = prompt_len, beam, new_tokens
    shape = WorkloadShape("beam_search", prompt_tokens=P, beam_width=B, max_new_tokens=T, constrained=False)
    workload = SyntheticWorkload.from_checkpoint(shape, checkpoint, soft_token=False)
    engine = create_engine("torch", checkpoint, dtype=dtype, device=device, **(options or {}))
    try:
        lm = engine.lm
        n = 4 if quick else 10
        rows = engine_times(engine, workload, n, sample_rate)
        kern = kernel_times(lm, P, B, T, repeats=3 if quick else 7)
    finally:
        engine.shutdown()
    fl = flops(lm, P, B, T)
    total, pre, dec, _ = sorted(rows)[len(rows) // 2]  # the median request (upper median), with its own parts
    rates = sorted(r[3] for r in rows if r[3] is not None)
    if rates:
        peak_gflops = rates[len(rates) // 2]
    phases = [Phase(name, fl[name] / 1e9, fl[name] / peak_gflops / 1e6, kern[name]) for name in fl]
    floor = sum(p.matmul_floor_ms for p in phases)
    kfloor = sum(p.kernel_ms for p in phases)
    # each request over the floor at the rate measured around it (module doc); without samples, the one rate
    total_flop = sum(fl.values())
    paired = sorted(t / (total_flop / (r or peak_gflops) / 1e6) for t, _, _, r in rows)
    kpre = kern["prefill_gemm"] + kern["prefill_attention"] + kern["lm_head_prefill"]
    kdec = kfloor - kpre
    out = {
        "engine": engine.name, "gemm": lm.gemm, "device": str(device), "device_name": device_name(device),
        "params_m": round(lm.n_params() / 1e6, 2), "prompt": P, "beam": B, "new_tokens": T, "dtype": dtype,
        "matmul_gflops": peak_gflops, "gflop": total_flop / 1e9,
        "matmul_floor_ms": floor, "kernel_floor_ms": kfloor,
        "engine_ms": total, "engine_prefill_forward_ms": pre, "engine_decode_forwards_ms": dec,
        "engine_other_ms": total - pre - dec, "requests": len(rows),
        "engine_over_matmul_floor": paired[len(paired) // 2], "paired_ratio_range": [paired[0], paired[-1]],
        "matmul_gflops_range": [rates[0], rates[-1]] if rates else None,
        "per_request": [{"engine_ms": t, "matmul_gflops": r} for t, _, _, r in rows],
        "kernel_floor_over_matmul_floor": kfloor / floor,
        "engine_over_kernel_floor": total / kfloor,
        "phases": [asdict(p) for p in phases],
    }
    print(f"\ncompute floor of one beam request ({engine.name}): {out['params_m']}M params, prompt {P}, beam {B}, "
          f"{T} new tokens, unconstrained, {dtype}; matmul rate {peak_gflops:.1f} GFLOP/s "
          f"({default_gemm_n(device)}^3); "
          f"{out['device_name']}; layer GEMMs "
          f"{lm.gemm} ({lm.gemm_why})")
    print(f"{'phase':<18} {'GFLOP':>7} {'matmul floor ms':>16} {'kernels alone ms':>17} {'kernel GFLOP/s':>15}")
    for p in phases:
        print(f"{p.name:<18} {p.gflop:>7.2f} {p.matmul_floor_ms:>16.0f} {p.kernel_ms:>17.0f} "
              f"{p.gflop / p.kernel_ms * 1000:>15.1f}")
    print(f"{'total':<18} {out['gflop']:>7.2f} {floor:>16.0f} {kfloor:>17.0f}")
    print(f"engine (median of {len(rows)} unloaded requests, in-process): {total:.0f} ms = prefill forward {pre:.0f} "
          f"(kernels {kpre:.0f}) + decode forwards {dec:.0f} (kernels {kdec:.0f}) + selection/scheduling "
          f"{total - pre - dec:.0f}")
    if rates:
        print(f"matmul rate around the requests: {rates[0]:.0f}-{rates[-1]:.0f} GFLOP/s (median {peak_gflops:.0f}); "
              f"each request over its own floor: {paired[0]:.2f}-{paired[-1]:.2f}x")
    print(f"engine / matmul floor = {out['engine_over_matmul_floor']:.2f}x (median request, paired)  "
          f"(kernel floor / matmul floor = {out['kernel_floor_over_matmul_floor']:.2f}x, "
          f"engine / kernel floor = {out['engine_over_kernel_floor']:.2f}x)")
    print(json.dumps(out))
    sys.stdout.flush()
    return out
