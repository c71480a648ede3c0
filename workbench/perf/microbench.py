"""`workbench microbench`: the torch engine vs the plain `hf` baseline, side by side, same model and prompts.

Measures, in one run (a script, not a timed test):

- beam search (prompt 512, beam 30, 5 new tokens, constrained unless `--no-constrained`, 32 concurrent): torch vs hf, as
  time per request (hf runs requests one after another, so its per-request time is its wall time
  over the requests it ran; `--hf-requests` limits how many, since it is ~30x slower);
- multi-item scoring (prompt 512, 500 candidates of 5 tokens): one pass vs fan-out (hf; with
  `--hf-candidates` below 500 the fan-out time is scaled linearly per candidate, and says so);
- soft-token overhead: the same beam workload with a user vector vs plain token ids;
- achieved FLOP/s of the torch engine on the beam workload over a matmul rate measured in the
  same process (the compute roofline of this machine);
- KV-cache bytes held at beam 30 vs beam 1 (shared prompt KV, not one copy per beam);
- throughput at 32 concurrent requests vs 1 (batching works).

Prints a table and, last, one JSON line with every number; each invocation is also one MLflow run in the
experiment `perf` (arguments, CPU, versions, that JSON and its headline numbers: `perf/record.py`; `--experiment`,
`--tracking-uri`, `--no-track`), which `workbench report --experiment perf` shows. Example:

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
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

from workbench import names, tracking
from workbench.engines.torch import options as torch_options
from workbench.errors import UsageError
from workbench.perf import record
from workbench.hardware import device_name, matmul_gflops
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
                   help="auto: bfloat16 on a CUDA device or where the CPU has AMX or AVX512-BF16, else float32; both "
                        "(with --floor): "
                        "float32 then bfloat16 in one run, side by side")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (the JSON names the device's model)")
    p.add_argument("--constrained", action=argparse.BooleanOptionalAction, default=True,
                   help="side by side: beam search constrained to the catalog's SIDs (the default) or, with "
                        "--no-constrained, free over the vocabulary (the floor is always unconstrained)")
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
    record.add_flags(p)
    return p.parse_args(argv)


def build_checkpoint(size: str, sid_depth: int, prompt_len: int, folder: Path) -> Path:
    """A random Qwen3 checkpoint of a named size whose catalog SIDs are `sid_depth` tokens deep.

    The catalog is this benchmark's own: 2,000 items and a 1,000-word base vocabulary (the recorded
    runs under docs/results/: 2.64M parameters in all at 2.4m, 26.3M at 25m).
    """
    depth_levels = (16,) * (sid_depth - 1)  # the dedup digit is the last level
    print(f"building a random {size} Qwen3 checkpoint (SID depth {sid_depth}) ...", file=sys.stderr)
    kw = random_size(size, for_disk=True).checkpoint_kwargs() | {"vocab_base": 1000}
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


def mode_of(args: argparse.Namespace) -> str:
    return "ab" if args.ab else "floor" if args.floor else "microbench"


def parse(argv) -> argparse.Namespace:
    """The arguments, with every combination that cannot run refused (a UsageError) before any work starts or a
    run is recorded; `args.options`: the torch engine options the flags ask for, `args.sides`: `--ab`'s A and B."""
    from workbench.perf.abbench import parse_options

    args = parse_args(argv)
    if not args.checkpoint:
        random_size(args.model, for_disk=True)  # 1.7b is built in memory only (scripts/gpu_probe.sh measures it)
    args.options = torch_options.from_args(args)
    if args.ab:
        if args.options:
            raise UsageError("with --ab, give --compile / --quantize inside A or B (compile=true, quantize=int8)")
        if args.dtype == "both":
            raise UsageError("--dtype both is for --floor; with --ab give each side's dtype inside A or B")
        args.sides = [{"dtype": args.dtype} | parse_options(x) for x in args.ab]  # --dtype: a side's unless set
    elif not args.floor and args.dtype == "both":
        raise UsageError("--dtype both is for --floor; the side-by-side microbench runs one dtype")
    return args


def cpu_line() -> str:
    """The CPU, its instruction sets that matter and whether large tensors sit on huge pages, in one line."""
    from workbench import malloc
    from workbench.hardware import cpu_info

    cpu = cpu_info()
    return (f"{cpu['cpu_model']} ({cpu['cpu_flags'] or 'no AVX-512'}); malloc huge pages "
            f"{'on' if malloc.active() else 'off'}")


def checkpoint_for(args: argparse.Namespace, folder: Path) -> Path:
    """`--checkpoint`, else a random checkpoint of `--model` built in `folder`."""
    if args.checkpoint:
        return Path(args.checkpoint)
    return build_checkpoint(args.model, args.new_tokens, args.prompt_len, folder)


def run_ab_mode(args: argparse.Namespace, line: str) -> list[dict]:
    """`--ab A B`: both configurations on the same requests (abbench.py); its JSON document."""
    import torch

    from workbench.perf.abbench import run_ab

    a, b = args.sides
    print(f"cpu: {line}; threads {torch.get_num_threads()}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        ck = checkpoint_for(args, Path(tmp))
        return [run_ab(ck, a, b, prompt_len=args.prompt_len, beam=args.beam, new_tokens=args.new_tokens,
                       requests=6 if args.quick else 30, device=args.device)]


def run_floor_mode(args: argparse.Namespace, line: str) -> list[dict]:
    """`--floor`: one request vs the compute floor per dtype (floorbench.py), then the summary table."""
    import torch

    from workbench.hardware import resolve_dtype
    from workbench.perf.floorbench import run_floor

    dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [resolve_dtype(args.dtype, device=args.device)]
    outs = []
    with tempfile.TemporaryDirectory() as tmp:
        ck = checkpoint_for(args, Path(tmp))
        for dt in dtypes:
            print(f"cpu: {line}; dtype {dt}; threads {torch.get_num_threads()}", file=sys.stderr)
            peak, library, sample_rate = _floor_rate(dt, args.device)
            print(f"matmul rate {peak:.0f} GFLOP/s ({library}, the faster GEMM library here)", file=sys.stderr)
            outs.append(run_floor(ck, peak, prompt_len=args.prompt_len, beam=args.beam, new_tokens=args.new_tokens,
                                  dtype=dt, device=args.device, quick=args.quick, options=args.options,
                                  sample_rate=sample_rate))
    print_floor_summary(outs, line, args.model)
    return outs


def print_floor_summary(outs: list[dict], line: str, model: str) -> None:
    import torch

    print(f"\nfloor summary on {line}, {torch.get_num_threads()} thread(s), {model}:")
    print("| engine | dtype | layer GEMMs | matmul GFLOP/s | matmul floor ms | engine ms | prefill ms | decode ms | "
          "engine / floor (paired: median, range) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for o in outs:
        lo, hi = o["paired_ratio_range"]
        print(f"| {o['engine']} | {o['dtype']} | {o['gemm']} | {o['matmul_gflops']:.0f} | {o['matmul_floor_ms']:.0f} | "
              f"{o['engine_ms']:.0f} | {o['engine_prefill_forward_ms']:.0f} | {o['engine_decode_forwards_ms']:.0f} | "
              f"{o['engine_over_matmul_floor']:.2f}x ({lo:.2f}-{hi:.2f}) |")


@dataclass
class SideBySide:
    """The default mode's setting: its arguments, checkpoint and how much of the slow hf baseline to run."""

    args: argparse.Namespace
    checkpoint: Path
    repeats: int
    hf_requests: int
    hf_candidates: int

    @classmethod
    def of(cls, args: argparse.Namespace, checkpoint: Path) -> "SideBySide":
        return cls(args, checkpoint, repeats=1 if args.quick else 2,
                   hf_requests=args.hf_requests or (1 if args.quick else 4),
                   hf_candidates=min(args.candidates, args.hf_candidates or (50 if args.quick else args.candidates)))

    @cached_property
    def beam_workload(self) -> SyntheticWorkload:
        """The beam requests every torch / hf comparison draws from (read from the checkpoint once)."""
        return self.workload()

    def workload(self, kind: str = "beam_search", beam: int | None = None, soft: bool = False) -> SyntheticWorkload:
        a = self.args
        shape = WorkloadShape(kind, prompt_tokens=a.prompt_len, beam_width=a.beam if beam is None else beam,
                              max_new_tokens=a.new_tokens, constrained=a.constrained, candidates=a.candidates,
                              candidate_tokens=5)
        return SyntheticWorkload.from_checkpoint(shape, self.checkpoint, soft_token=soft)


def build_engines(s: SideBySide):
    """The torch engine (with the variant options) and the hf baseline on the same checkpoint."""
    from workbench.engines.registry import create_engine

    a = s.args
    te = create_engine("torch", s.checkpoint, dtype=a.dtype, device=a.device, max_batch_tokens=a.max_batch_tokens,
                       max_candidates=max(1024, a.candidates), **a.options)
    he = create_engine("hf", s.checkpoint, dtype=a.dtype, device=a.device, max_candidates=max(1024, a.candidates))
    return te, he


def warm_up(te, s: SideBySide) -> None:
    check(asyncio.run(te.beam_search(s.beam_workload.requests(2))))


def measure_beam(te, he, s: SideBySide) -> dict:
    """Beam search: torch at `--concurrency` and alone (the throughput ratio), hf one request after another."""
    a = s.args
    reqs = s.beam_workload.requests(a.concurrency, first=2)
    te.reset_stats()
    t_torch, res = timed(lambda: te.beam_search(reqs), s.repeats)
    check(res)
    stats = te.stats
    flops = stats.prefill_tokens / s.repeats * te.lm.flops_per_token(a.prompt_len / 2) + (
        stats.decode_rows / s.repeats * te.lm.flops_per_token(a.prompt_len)
    )
    t_one, r1 = timed(lambda: te.beam_search(reqs[:1]), s.repeats)
    check(r1)
    print(f"hf beam search on {s.hf_requests} request(s) ...", file=sys.stderr)
    t0 = time.perf_counter()
    hres = check(asyncio.run(he.beam_search(reqs[:s.hf_requests])))
    t_hf = (time.perf_counter() - t0) / s.hf_requests
    same = all([b.token_ids for b in x.beams] == [b.token_ids for b in h.beams] for x, h in zip(res, hres))
    return {"t_torch": t_torch, "t_one": t_one, "t_hf": t_hf, "same": same, "achieved": flops / t_torch / 1e9}


def measure_soft_token(te, s: SideBySide) -> float:
    """The soft-token overhead: the same prompts with the placeholder (soft) vs a plain token there (the
    workloads draw the same ids for an index either way); alternated and min-of-repeats so machine noise does
    not masquerade as overhead."""
    a = s.args
    n_soft = max(4, a.concurrency // (8 if a.quick else 2))
    soft = s.workload(soft=True).requests(n_soft)
    plain = s.beam_workload.requests(n_soft)
    t_plain = t_soft = float("inf")
    for _ in range(3):
        t_plain = min(t_plain, timed(lambda: te.beam_search(plain))[0])
        dt, rs = timed(lambda: te.beam_search(soft))
        check(rs)
        t_soft = min(t_soft, dt)
    return t_soft / t_plain - 1.0


def measure_kv(te, s: SideBySide) -> dict[int, tuple[int, int]]:
    """KV bytes held (and what a copy per beam would hold) at `--beam` and at beam 1."""
    kv = {}
    for b in (s.args.beam, 1):
        te.reset_stats()
        check(asyncio.run(te.beam_search(s.workload(beam=b).requests(1))))
        kv[b] = (te.stats.peak_kv_bytes, te.stats.peak_kv_bytes_if_copied)
    return kv


def measure_scoring(te, he, s: SideBySide) -> dict:
    """Multi-item scoring: torch's one pass vs hf's fan-out (scaled per candidate), and their largest difference."""
    import numpy as np

    from workbench.engines.base import ScoreRequest

    a = s.args
    sreq = s.workload("scoring").request(0)
    prompt, cands = sreq.prompt, sreq.candidates
    t_score, sres = timed(lambda: te.score([sreq]), s.repeats)
    check(sres)
    print(f"hf fan-out scoring of {s.hf_candidates} candidates ...", file=sys.stderr)
    t0 = time.perf_counter()
    hs = check(asyncio.run(he.score([ScoreRequest(prompt, cands[:s.hf_candidates])])))
    t_fan = (time.perf_counter() - t0) * a.candidates / s.hf_candidates
    diff = float(np.abs(np.asarray(sres[0].scores[:s.hf_candidates]) - np.asarray(hs[0].scores)).max())
    return {"t_score": t_score, "t_fan": t_fan, "diff": diff}


def summarize(s: SideBySide, engine: str, n_params: int, peak: float, beam: dict, soft_overhead: float,
              kv: dict, score: dict) -> dict:
    """The default mode's JSON document: every number, with the date, commit, machine and versions."""
    import torch

    a = s.args
    per_req_torch = beam["t_torch"] / a.concurrency
    throughput = a.concurrency / beam["t_torch"]
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": tracking.git_commit(),
        "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
                    f"torch threads {torch.get_num_threads()}",
        "device": a.device,
        "device_name": device_name(a.device),  # the GPU's model on CUDA (the CPU's is in `hardware`)
        "torch": torch.__version__,
        "model": a.model,
        "engine": engine,
        "params_m": round(n_params / 1e6, 2),
        "dtype": a.dtype,
        "quick": a.quick,
        "workload": {"prompt": a.prompt_len, "beam": a.beam, "new_tokens": a.new_tokens,
                     "concurrency": a.concurrency, "candidates": a.candidates, "constrained": a.constrained},
        "beam_torch_s_per_req": per_req_torch,
        "beam_hf_s_per_req": beam["t_hf"],
        "beam_speedup": beam["t_hf"] / per_req_torch,
        "beam_same_beams_as_hf": beam["same"],
        "hf_requests_measured": s.hf_requests,
        "score_onepass_s": score["t_score"],
        "score_fanout_s": score["t_fan"],
        "score_speedup": score["t_fan"] / score["t_score"],
        "score_max_abs_diff": score["diff"],
        "hf_candidates_measured": s.hf_candidates,
        "soft_token_overhead": soft_overhead,
        "matmul_gflops": peak,
        "torch_gflops": beam["achieved"],
        "roofline_fraction": beam["achieved"] / peak,
        "kv_bytes_beam": kv[a.beam][0],
        "kv_bytes_beam1": kv[1][0],
        "kv_ratio": kv[a.beam][0] / max(kv[1][0], 1),
        "kv_bytes_if_copied": kv[a.beam][1],
        "throughput_32_rps": throughput,
        "throughput_1_rps": 1 / beam["t_one"],
        "throughput_ratio": throughput / (1 / beam["t_one"]),
    }


def print_side_by_side(out: dict, a: argparse.Namespace) -> None:
    """The default mode's table, then its JSON document on one line."""
    kvb, kv1, kvc = out["kv_bytes_beam"], out["kv_bytes_beam1"], out["kv_bytes_if_copied"]
    rows = [
        ("beam search s/request (torch | hf)", f"{out['beam_torch_s_per_req']:.4f} | {out['beam_hf_s_per_req']:.3f}",
         f"{out['beam_speedup']:.1f}x (target >= 20x)"),
        ("  same beams as hf", str(out["beam_same_beams_as_hf"]),
         f"hf measured on {out['hf_requests_measured']} request(s)"),
        ("scoring 500 cands s (one pass | fan-out)", f"{out['score_onepass_s']:.3f} | {out['score_fanout_s']:.2f}",
         f"{out['score_speedup']:.1f}x (target >= 30x)"),
        ("  max |one pass - fan-out|", f"{out['score_max_abs_diff']:.2e}",
         f"fan-out measured on {out['hf_candidates_measured']} candidates, scaled"),
        ("soft-token overhead", f"{100 * out['soft_token_overhead']:+.1f}%", "target <= 5%"),
        ("torch GFLOP/s | matmul GFLOP/s", f"{out['torch_gflops']:.0f} | {out['matmul_gflops']:.0f}",
         f"{100 * out['roofline_fraction']:.0f}% of roofline"),
        (f"KV bytes beam {a.beam} | beam 1", f"{kvb / 1e6:.2f}MB | {kv1 / 1e6:.2f}MB",
         f"{out['kv_ratio']:.2f}x (copied per beam: {kvc / 1e6:.1f}MB)"),
        (f"throughput req/s at {a.concurrency} | 1", f"{out['throughput_32_rps']:.2f} | {out['throughput_1_rps']:.2f}",
         f"{out['throughput_ratio']:.1f}x"),
    ]
    print(f"\nmicrobench: {out['engine']} on {a.model} ({out['params_m']}M params, {a.dtype}), prompt {a.prompt_len}, "
          f"beam {a.beam}, "
          f"{a.new_tokens} new, {'constrained' if a.constrained else 'unconstrained'}, {a.concurrency} concurrent; "
          f"{out['hardware']}; device {a.device} ({out['device_name']})")
    w = max(len(r[0]) for r in rows)
    for name, val, ratio in rows:
        print(f"{name:<{w}}  {val:<24} {ratio}")
    print(json.dumps(out))


def run_side_by_side(args: argparse.Namespace, line: str) -> list[dict]:
    """The default mode: torch vs hf on the same checkpoint and prompts (module doc); its JSON document."""
    import torch

    from workbench.hardware import resolve_dtype

    args.dtype = resolve_dtype(args.dtype, device=args.device)
    print(f"cpu: {line}; dtype {args.dtype}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        s = SideBySide.of(args, checkpoint_for(args, Path(tmp)))
        te, he = build_engines(s)
        try:
            n_params = te.lm.n_params()
            peak = matmul_gflops(getattr(torch, args.dtype), args.device)
            print(f"model {args.model}: {n_params / 1e6:.2f}M params, {args.dtype}, matmul {peak:.0f} GFLOP/s",
                  file=sys.stderr)
            warm_up(te, s)
            beam = measure_beam(te, he, s)
            soft = measure_soft_token(te, s)
            kv = measure_kv(te, s)
            score = measure_scoring(te, he, s)
        finally:
            te.shutdown()
    out = summarize(s, te.name, n_params, peak, beam, soft, kv, score)
    print_side_by_side(out, args)
    return [out]


RUNNERS: dict[str, Callable[[argparse.Namespace, str], list[dict]]] = {
    "microbench": run_side_by_side, "floor": run_floor_mode, "ab": run_ab_mode}


def main(argv=None) -> int:
    """Parse, set the thread count, run the mode (its engines, warm-up, measurements, table and JSON) inside one
    MLflow run that records what it printed (record.py; `--no-track`: none)."""
    argv = list(argv or [])
    args = parse(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    mode = mode_of(args)
    with record.perf_run(args, argv, mode, torch.get_num_threads()) as rec:
        rec.log(RUNNERS[mode](args, cpu_line()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
