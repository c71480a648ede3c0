"""`workbench microbench`: the torch engine vs the plain `hf` baseline, side by side, same model and prompts.

Measures, in one run (a script, not a timed test):

- beam search (prompt 512, beam 30, 5 new tokens, constrained, 32 concurrent): torch vs hf, as
  time per request (hf runs requests one after another, so its per-request time is its wall time
  over the requests it ran; `--hf-requests` limits how many, since it is ~30x slower);
- multi-item scoring (prompt 512, 500 candidates of 5 tokens): one pass vs fan-out (hf; with
  `--hf-candidates` below 500 the fan-out time is scaled linearly per candidate, and says so);
- soft-token overhead: the same beam workload with a user vector vs plain token ids;
- achieved FLOP/s of the torch engine on the beam workload over a matmul rate measured in the
  same process (the compute roofline of this machine);
- KV-cache bytes held at beam 30 vs beam 1 (shared prompt KV, not one copy per beam);
- throughput at 32 concurrent requests vs 1 (batching works).

Prints a table and, last, one JSON line with every number. Example:

    workbench microbench --model 2.4m --quick
    workbench microbench --model 25m              # ~25M-parameter Qwen3
    workbench microbench --model 25m --floor --threads 1     # one request vs the compute floor, by phase
    workbench microbench --model 25m --floor --threads 1 --dtype bfloat16 --compile   # a torch engine variant
    workbench microbench --model 25m --floor --threads 1 --quantize int8
    workbench microbench --model 25m --threads 1 --ab gemm=default,dtype=bfloat16 gemm=onednn,dtype=bfloat16

`--compile` / `--quantize int8` apply to the torch engine only (the hf baseline stays as it is).

Model sizes are the named random sizes of `workbench/model/random_checkpoint.py` (shared with the load
benchmark's `random:<size>`); prompts come from the synthetic workloads of `workbench/engines/workloads.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from workbench import names, tracking
from workbench.engines.torch import options as torch_options
from workbench.errors import UsageError
from workbench.hardware import matmul_gflops
from workbench.engines.workloads import SyntheticWorkload, WorkloadShape
from workbench.model.random_checkpoint import SIZES, make_random_checkpoint, random_size



SAMPLE_S = 0.1  # one rate sample around each floor request (floorbench's module doc)


def _floor_rate(dtype: str, device: str) -> tuple[float, str, Callable[[], float]]:
    """The square-GEMM rate a compute floor divides by, its library and a ~0.1 s sampler of that same GEMM (taken
    around each floor request): the faster of PyTorch's default GEMM and, on CPU, oneDNN with a packed weight
    (float32: 2.2x faster on an AMD EPYC Zen 5; the torch engine uses what is faster: torch/onednn.py)."""
    import torch

    from workbench.engines.torch import onednn as torch_onednn

    dt = getattr(torch, dtype)
    measure = {"torch.matmul": lambda seconds: matmul_gflops(dt, device, seconds=seconds)}
    usable = {"float32": torch_onednn.available(), "bfloat16": torch_onednn.bf16_supported()}.get(dtype, False)
    if device == "cpu" and usable:
        measure["oneDNN"] = lambda seconds: torch_onednn.gflops(seconds=seconds, dtype=dt)
    rates = {lib: max(fn(1.0) for _ in range(3)) for lib, fn in measure.items()}
    library = max(rates, key=rates.get)
    return rates[library], library, lambda: measure[library](SAMPLE_S)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="workbench microbench", description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=list(SIZES), default="2.4m",
                   help="random Qwen3 size, named by its non-embedding parameters (workbench/model/random_checkpoint.py)")
    p.add_argument("--checkpoint", default=None, help="use this checkpoint instead of a random one")
    p.add_argument("--quick", action="store_true", help="fewer hf requests/candidates and repeats (about a minute)")
    p.add_argument("--dtype", default="float32", choices=[*names.DTYPES, "both"],
                   help="auto: bfloat16 where the CPU has AMX or AVX512-BF16, else float32; both (with --floor): "
                        "float32 then bfloat16 in one run, side by side")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--beam", type=int, default=30)
    p.add_argument("--new-tokens", type=int, default=5, help="also the SID depth of the random catalog")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--candidates", type=int, default=500)
    p.add_argument("--hf-requests", type=int, default=None, help="beam requests run on hf (default 4, quick 1)")
    p.add_argument("--hf-candidates", type=int, default=None, help="candidates scored by hf fan-out (default 500, quick 50)")
    p.add_argument("--max-batch-tokens", type=int, default=16384)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--floor", action="store_true",
                   help="instead: one unloaded beam request vs the compute floor, by phase (workbench/perf/floorbench.py)")
    p.add_argument("--ab", nargs=2, metavar=("A", "B"), default=None,
                   help="instead: two torch engine configurations (comma-separated options, e.g. gemm=default "
                        "gemm=onednn) on the same beam requests, alternating in one process; prints the paired "
                        "ratio B / A (workbench/perf/abbench.py)")
    torch_options.add_flags(p)
    return p.parse_args(argv)


def build_checkpoint(size: str, sid_depth: int, prompt_len: int, folder: Path) -> Path:
    """A random Qwen3 checkpoint of a named size whose catalog SIDs are `sid_depth` tokens deep.

    The catalog is this benchmark's own: 2,000 items and a 1,000-word base vocabulary (the README's
    recorded runs: 2.64M parameters in all at 2.4m, 26.3M at 25m).
    """
    depth_levels = (16,) * (sid_depth - 1)  # the dedup digit is the last level
    print(f"building a random {size} Qwen3 checkpoint (SID depth {sid_depth}) ...", file=sys.stderr)
    kw = random_size(size).checkpoint_kwargs() | {"vocab_base": 1000}
    return make_random_checkpoint(folder / f"ck_{size}", arch="qwen3", n_items=2000, levels=depth_levels,
                                  max_position_embeddings=max(1024, prompt_len + 64), seed=0, **kw)


def timed(coro_fn, repeats: int = 1):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = asyncio.run(coro_fn())
        best = min(best, time.perf_counter() - t0)
    return best, out


def check(results):
    bad = [r.error for r in results if not r.success]
    if bad:
        raise RuntimeError(f"{len(bad)} requests failed, first: {bad[0]}")
    return results


def main(argv=None) -> int:
    args = parse_args(argv or [])
    import numpy as np
    import torch

    from workbench.engines.base import ScoreRequest
    from workbench.engines.registry import create_engine

    if args.threads:
        torch.set_num_threads(args.threads)
    hf_requests = args.hf_requests or (1 if args.quick else 4)
    hf_cands = min(args.candidates, args.hf_candidates or (50 if args.quick else args.candidates))
    repeats = 1 if args.quick else 2
    from workbench.hardware import cpu_info, resolve_dtype

    cpu = cpu_info()
    from workbench import malloc

    cpu_line = (f"{cpu['cpu_model']} ({cpu['cpu_flags'] or 'no AVX-512'}); malloc huge pages "
                f"{'on' if malloc.active() else 'off'}")
    options = torch_options.from_args(args)
    if args.ab:
        from workbench.perf.abbench import parse_options, run_ab

        if options:
            raise UsageError("with --ab, give --compile / --quantize inside A or B (compile=true, quantize=int8)")
        if args.dtype == "both":
            raise UsageError("--dtype both is for --floor; with --ab give each side's dtype inside A or B")
        a, b = ({"dtype": args.dtype} | parse_options(x) for x in args.ab)  # --dtype: a side's unless it sets one
        print(f"cpu: {cpu_line}; threads {torch.get_num_threads()}", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            ck = Path(args.checkpoint) if args.checkpoint else build_checkpoint(args.model, args.new_tokens,
                                                                                args.prompt_len, Path(tmp))
            run_ab(ck, a, b, prompt_len=args.prompt_len, beam=args.beam, new_tokens=args.new_tokens,
                   requests=6 if args.quick else 30, device=args.device)
        return 0
    if args.floor:
        from workbench.perf.floorbench import run_floor

        dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [resolve_dtype(args.dtype)]
        outs = []
        with tempfile.TemporaryDirectory() as tmp:
            ck = Path(args.checkpoint) if args.checkpoint else build_checkpoint(args.model, args.new_tokens,
                                                                                args.prompt_len, Path(tmp))
            for dt in dtypes:
                print(f"cpu: {cpu_line}; dtype {dt}; threads {torch.get_num_threads()}", file=sys.stderr)
                peak, library, sample_rate = _floor_rate(dt, args.device)
                print(f"matmul rate {peak:.0f} GFLOP/s ({library}, the faster GEMM library here)", file=sys.stderr)
                outs.append(run_floor(ck, peak, prompt_len=args.prompt_len, beam=args.beam, new_tokens=args.new_tokens,
                                      dtype=dt, device=args.device, quick=args.quick, options=options,
                                      sample_rate=sample_rate))
        print(f"\nfloor summary on {cpu_line}, {torch.get_num_threads()} thread(s), {args.model}:")
        print("| engine | dtype | layer GEMMs | matmul GFLOP/s | matmul floor ms | engine ms | prefill ms | decode ms | "
              "engine / floor (paired: median, range) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for o in outs:
            lo, hi = o["paired_ratio_range"]
            print(f"| {o['engine']} | {o['dtype']} | {o['gemm']} | {o['matmul_gflops']:.0f} | {o['matmul_floor_ms']:.0f} | "
                  f"{o['engine_ms']:.0f} | {o['engine_prefill_forward_ms']:.0f} | {o['engine_decode_forwards_ms']:.0f} | "
                  f"{o['engine_over_matmul_floor']:.2f}x ({lo:.2f}-{hi:.2f}) |")
        return 0
    if args.dtype == "both":
        raise UsageError("--dtype both is for --floor; the side-by-side microbench runs one dtype")
    args.dtype = resolve_dtype(args.dtype)
    print(f"cpu: {cpu_line}; dtype {args.dtype}", file=sys.stderr)
    tdtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(args.checkpoint) if args.checkpoint else build_checkpoint(args.model, args.new_tokens,
                                                                            args.prompt_len, Path(tmp))

        def workload(kind: str = "beam_search", beam: int = args.beam, soft: bool = False) -> SyntheticWorkload:
            shape = WorkloadShape(kind, prompt_tokens=args.prompt_len, beam_width=beam, max_new_tokens=args.new_tokens,
                                  constrained=True, candidates=args.candidates, candidate_tokens=5)
            return SyntheticWorkload.from_checkpoint(shape, ck, soft_token=soft)

        beam_workload = workload()
        te = create_engine("torch", ck, dtype=args.dtype, device=args.device, max_batch_tokens=args.max_batch_tokens,
                           max_candidates=max(1024, args.candidates), **options)
        he = create_engine("hf", ck, dtype=args.dtype, device=args.device, max_candidates=max(1024, args.candidates))
        n_params = te.lm.n_params()
        peak = matmul_gflops(tdtype, args.device)
        print(f"model {args.model}: {n_params / 1e6:.2f}M params, {args.dtype}, matmul {peak:.0f} GFLOP/s", file=sys.stderr)

        # warm-up
        check(asyncio.run(te.beam_search(beam_workload.requests(2))))
        # beam search: torch, 32 concurrent
        reqs = beam_workload.requests(args.concurrency, first=2)
        te.reset_stats()
        t_torch, res = timed(lambda: te.beam_search(reqs), repeats)
        check(res)
        stats = te.stats
        flops = stats.prefill_tokens / repeats * te.lm.flops_per_token(args.prompt_len / 2) + (
            stats.decode_rows / repeats * te.lm.flops_per_token(args.prompt_len)
        )
        achieved = flops / t_torch / 1e9
        # beam search: 1 request alone (throughput ratio)
        t_one, r1 = timed(lambda: te.beam_search(reqs[:1]), repeats)
        check(r1)
        # hf on the first requests, one after another
        print(f"hf beam search on {hf_requests} request(s) ...", file=sys.stderr)
        t0 = time.perf_counter()
        hres = check(asyncio.run(he.beam_search(reqs[:hf_requests])))
        t_hf = (time.perf_counter() - t0) / hf_requests
        same = all([b.token_ids for b in a.beams] == [b.token_ids for b in h.beams] for a, h in zip(res, hres))
        # soft token overhead: the same prompts with the placeholder (soft) vs a plain token there (the
        # workloads draw the same ids for an index either way); alternated and min-of-repeats so machine
        # noise does not masquerade as overhead
        n_soft = max(4, args.concurrency // (8 if args.quick else 2))
        soft = workload(soft=True).requests(n_soft)
        plain = beam_workload.requests(n_soft)
        t_plain = t_soft = float("inf")
        for _ in range(3):
            t_plain = min(t_plain, timed(lambda: te.beam_search(plain))[0])
            dt, rs = timed(lambda: te.beam_search(soft))
            check(rs)
            t_soft = min(t_soft, dt)
        # KV bytes: beam 30 vs beam 1
        kv = {}
        for b in (args.beam, 1):
            te.reset_stats()
            check(asyncio.run(te.beam_search(workload(beam=b).requests(1))))
            kv[b] = (te.stats.peak_kv_bytes, te.stats.peak_kv_bytes_if_copied)
        # scoring: one pass vs fan-out
        sreq = workload("scoring").request(0)
        prompt, cands = sreq.prompt, sreq.candidates
        t_score, sres = timed(lambda: te.score([sreq]), repeats)
        check(sres)
        print(f"hf fan-out scoring of {hf_cands} candidates ...", file=sys.stderr)
        t0 = time.perf_counter()
        hs = check(asyncio.run(he.score([ScoreRequest(prompt, cands[:hf_cands])])))
        t_fan = (time.perf_counter() - t0) * args.candidates / hf_cands
        score_diff = float(np.abs(np.asarray(sres[0].scores[:hf_cands]) - np.asarray(hs[0].scores)).max())
        te.shutdown()

    per_req_torch = t_torch / args.concurrency
    out = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": tracking.git_commit(),
        "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}",
        "torch": torch.__version__,
        "model": args.model,
        "engine": te.name,
        "params_m": round(n_params / 1e6, 2),
        "dtype": args.dtype,
        "quick": args.quick,
        "workload": {"prompt": args.prompt_len, "beam": args.beam, "new_tokens": args.new_tokens,
                     "concurrency": args.concurrency, "candidates": args.candidates, "constrained": True},
        "beam_torch_s_per_req": per_req_torch,
        "beam_hf_s_per_req": t_hf,
        "beam_speedup": t_hf / per_req_torch,
        "beam_same_beams_as_hf": same,
        "hf_requests_measured": hf_requests,
        "score_onepass_s": t_score,
        "score_fanout_s": t_fan,
        "score_speedup": t_fan / t_score,
        "score_max_abs_diff": score_diff,
        "hf_candidates_measured": hf_cands,
        "soft_token_overhead": t_soft / t_plain - 1.0,
        "matmul_gflops": peak,
        "torch_gflops": achieved,
        "roofline_fraction": achieved / peak,
        "kv_bytes_beam": kv[args.beam][0],
        "kv_bytes_beam1": kv[1][0],
        "kv_ratio": kv[args.beam][0] / max(kv[1][0], 1),
        "kv_bytes_if_copied": kv[args.beam][1],
        "throughput_32_rps": args.concurrency / t_torch,
        "throughput_1_rps": 1 / t_one,
        "throughput_ratio": (args.concurrency / t_torch) / (1 / t_one),
    }
    rows = [
        ("beam search s/request (torch | hf)", f"{per_req_torch:.4f} | {t_hf:.3f}", f"{out['beam_speedup']:.1f}x (target >= 20x)"),
        ("  same beams as hf", str(same), f"hf measured on {hf_requests} request(s)"),
        ("scoring 500 cands s (one pass | fan-out)", f"{t_score:.3f} | {t_fan:.2f}", f"{out['score_speedup']:.1f}x (target >= 30x)"),
        ("  max |one pass - fan-out|", f"{score_diff:.2e}", f"fan-out measured on {hf_cands} candidates, scaled"),
        ("soft-token overhead", f"{100 * out['soft_token_overhead']:+.1f}%", "target <= 5%"),
        ("torch GFLOP/s | matmul GFLOP/s", f"{achieved:.0f} | {peak:.0f}", f"{100 * out['roofline_fraction']:.0f}% of roofline"),
        (f"KV bytes beam {args.beam} | beam 1", f"{kv[args.beam][0] / 1e6:.2f}MB | {kv[1][0] / 1e6:.2f}MB",
         f"{out['kv_ratio']:.2f}x (copied per beam: {kv[args.beam][1] / 1e6:.1f}MB)"),
        (f"throughput req/s at {args.concurrency} | 1", f"{out['throughput_32_rps']:.2f} | {out['throughput_1_rps']:.2f}",
         f"{out['throughput_ratio']:.1f}x"),
    ]
    print(f"\nmicrobench: {te.name} on {args.model} ({out['params_m']}M params, {args.dtype}), prompt {args.prompt_len}, "
          f"beam {args.beam}, "
          f"{args.new_tokens} new, constrained, {args.concurrency} concurrent; {out['hardware']}")
    w = max(len(r[0]) for r in rows)
    for name, val, ratio in rows:
        print(f"{name:<{w}}  {val:<24} {ratio}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
