"""`workbench microbench --ab A B`: two torch engine configurations on the same requests, alternating, in one process.

Why: these machines share their host, whose load moves every rate 10-30% within minutes
(docs/results/2026-12-02-engines-zen5.md: four runs of one command in four minutes, 186-252 ms per request). Two
benchmark runs a minute apart cannot resolve a 5-10% change. Here both engines live in one process and every request
runs on both, back to back, the order alternating, so each pair sees the same host; the answer is the median and
quartiles of the per-request ratio B / A, and how many requests got the same beams (token ids and cumulative
log-probs, exactly) from both: whether a speed change left the results alone.

A and B are comma-separated torch engine options, e.g. `gemm=default` vs `gemm=onednn`, `dtype=float32` vs
`dtype=bfloat16`, `compile=true`, `quantize=int8`; microbench's `--dtype` is the dtype of a side that names
none (an empty string: that dtype and the engine's defaults). Requests are the
synthetic unconstrained beam requests of `workbench/engines/workloads.py`, one at a time (unloaded).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from workbench import names
from workbench.engines.torch.onednn import GEMM_MODES
from workbench.engines.torch.options import QUANTIZE_MODES
from workbench.engines.workloads import SyntheticWorkload, WorkloadShape
from workbench.errors import UsageError

OPTIONS = {"dtype": names.DTYPES, "gemm": GEMM_MODES, "compile": ("true", "false"),
           "quantize": QUANTIZE_MODES}


def parse_options(text: str) -> dict:
    """"gemm=default,dtype=bfloat16" -> {"gemm": "default", "dtype": "bfloat16"}; a UsageError naming what is wrong."""
    out: dict = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in OPTIONS or value not in OPTIONS[key]:
            allowed = "; ".join(f"{k}={'|'.join(v)}" for k, v in OPTIONS.items())
            raise UsageError(f"--ab option {part!r} is not one of: {allowed} (comma-separated, e.g. gemm=default)")
        out[key] = value == "true" if key == "compile" else value
    return out


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(q1, median, q3) of paired ratios (inclusive quantiles; one value: itself three times). Also trainbench's."""
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
    return q1, q2, q3


def run_ab(checkpoint: Path, a: dict, b: dict, *, prompt_len: int, beam: int, new_tokens: int, requests: int,
           device: str = "cpu") -> dict:
    """Time `requests` beam requests on engine A and engine B alternately; print the paired result and its JSON.
    `a`, `b`: create_engine options (its defaults where absent; dtype "auto" resolved there)."""
    from workbench.engines.registry import create_engine

    shape = WorkloadShape("beam_search", prompt_tokens=prompt_len, beam_width=beam, max_new_tokens=new_tokens,
                          constrained=False)
    workload = SyntheticWorkload.from_checkpoint(shape, checkpoint, soft_token=False)
    engines = {}
    try:
        for side, opts in (("A", a), ("B", b)):
            engines[side] = create_engine("torch", checkpoint, device=device, **opts)

        def timed(side: str, req) -> tuple[float, list]:
            t0 = time.perf_counter()
            res = asyncio.run(engines[side].beam_search([req]))[0]
            ms = (time.perf_counter() - t0) * 1000
            if not res.success:
                raise RuntimeError(f"engine {side}: beam request failed: {res.error}")
            return ms, [(tuple(x.token_ids), x.cum_logprob) for x in res.beams]

        reqs = workload.requests(requests + 1)
        for side in engines:  # warm-up, not counted
            timed(side, reqs[0])
        rows = []
        for i, req in enumerate(reqs[1:]):
            order = ("A", "B") if i % 2 == 0 else ("B", "A")
            got = {side: timed(side, req) for side in order}
            rows.append({"a_ms": got["A"][0], "b_ms": got["B"][0], "same_beams": got["A"][1] == got["B"][1]})
    finally:
        for eng in engines.values():
            eng.shutdown()
    ratios = [r["b_ms"] / r["a_ms"] for r in rows]
    q1, med, q3 = quartiles(ratios)
    out = {
        "a": a, "b": b, "a_engine": {"name": engines["A"].name, "gemm": engines["A"].lm.gemm},
        "b_engine": {"name": engines["B"].name, "gemm": engines["B"].lm.gemm},
        "prompt": prompt_len, "beam": beam, "new_tokens": new_tokens, "requests": len(rows),
        "a_median_ms": statistics.median(r["a_ms"] for r in rows),
        "b_median_ms": statistics.median(r["b_ms"] for r in rows),
        "ratio_b_over_a": {"median": med, "q1": q1, "q3": q3},
        "same_beams": sum(r["same_beams"] for r in rows), "per_request": rows,
    }
    print(f"\nA {a or 'defaults'} ({out['a_engine']}) vs B {b or 'defaults'} ({out['b_engine']}): {len(rows)} beam "
          f"requests each (prompt {prompt_len}, beam {beam}, {new_tokens} new tokens), alternating in one process")
    print(f"A median {out['a_median_ms']:.1f} ms, B median {out['b_median_ms']:.1f} ms; per-request B / A: median "
          f"{med:.3f} (quartiles {q1:.3f}-{q3:.3f}); the same beams from both in {out['same_beams']} of {len(rows)}")
    print(json.dumps(out))
    sys.stdout.flush()
    return out
