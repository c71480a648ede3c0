"""What a faster engine variant costs in quality: bfloat16 (or int8) against float32 on a trained checkpoint.

    workbench variant-quality experiments/quickstart.yaml --method none \
        --variants float32 bfloat16 int8 [--users 943] [--threads 2]

Why: bf16 keeps 8 bits of mantissa, so beam scores of near-tied SIDs can swap; the speed of bf16 on AMX
(or of int8) is only worth having if the ranking it serves is as good. This runs the study's own
test prompts (the same users, the same constrained beam search of `evaluation.beam_width`) through the
torch engine once per variant, and reports Recall@10 / NDCG@10 per variant and the paired difference
against the first variant with a bootstrap interval over users (`study.outputs.compare`: one trained
model, so the interval covers user sampling, which is the whole source of variation between two
engines serving the same weights). The checkpoint is the one `workbench run` trained (it never trains).

Variants: a dtype (`float32`, `bfloat16`), or `int8` (float32 activations, int8 weights: the torch
engine's `quantize: int8` option, where it exists).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from workbench import names

VARIANTS = {"float32": ("float32", {}), "bfloat16": ("bfloat16", {}), "int8": ("float32", {"quantize": "int8"})}
METRICS = (names.recall_at(10), names.ndcg_at(10))


def _evaluate(checkpoint, prompts, beam_width: int, dtype: str, options: dict, batch_size: int):
    """Quality of one variant (constrained beam search over the prompts) and its wall time."""
    from workbench.engines import registry
    from workbench.model.checkpoint import read_catalog
    from workbench.study.outputs import Quality, beam_rank, device_options
    from workbench.sync import run_sync

    catalog = read_catalog(checkpoint)
    engine = registry.create_engine("torch", checkpoint=str(checkpoint), dtype=dtype, **device_options(), **options)
    try:
        t0 = time.perf_counter()
        br = beam_rank(engine, prompts, catalog, beam_width, True, True, batch_size, desc=f"{dtype} {options or ''}",
                       progress=True)
        wall = time.perf_counter() - t0
    finally:
        run_sync(engine.close())
    q = Quality.from_lists(prompts.method, prompts.users, prompts.targets, [l[:10] for l in br.lists], (10,))
    return q, wall, br.failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="workbench variant-quality", description=__doc__.split("\n")[0])
    p.add_argument("study", help="the study YAML that trained the checkpoint (e.g. experiments/quickstart.yaml)")
    p.add_argument("--method", default="none")
    p.add_argument("--variants", nargs="+", default=["float32", "bfloat16"], choices=list(VARIANTS))
    p.add_argument("--users", type=int, default=None, help="first N test users (default: all)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args(argv)

    import torch

    from workbench.hardware import cpu_info
    from workbench.load.sources import StudySource
    from workbench.study.outputs import compare

    if a.threads:
        torch.set_num_threads(a.threads)
    src = StudySource(a.study)
    ck = src.checkpoint(a.method)
    prompts = src.test_prompts(ck)
    if a.users:
        prompts = prompts.subset(range(min(a.users, len(prompts))))
    cpu = cpu_info()
    print(f"cpu: {cpu['cpu_model']} ({cpu['cpu_flags'] or 'no AVX-512'}); threads {torch.get_num_threads()}; "
          f"{a.method} on {len(prompts)} test users, beam {src.cfg.evaluation.beam_width}; checkpoint {ck}", file=sys.stderr)
    rows, base = [], None
    for v in a.variants:
        dtype, options = VARIANTS[v]
        q, wall, failed = _evaluate(ck, prompts, src.cfg.evaluation.beam_width, dtype, options, a.batch_size)
        row = {"variant": v, "users": len(prompts), "failed": failed, "wall_s": round(wall, 2)}
        for m in METRICS:
            row[m] = float(q.per_user[m].mean())
            if base is not None:
                d, lo, hi = compare(q, base, m)
                row[f"{m} diff"] = [round(d, 5), round(lo, 5), round(hi, 5)]
        base = base or q
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    print(f"\n| variant | R@10 | N@10 | R@10 vs {a.variants[0]} [95% CI over users] | N@10 vs {a.variants[0]} | wall s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        dr, dn = (r.get(f"{m} diff") for m in METRICS)
        f = (lambda d: "-" if d is None else f"{d[0]:+.4f} [{d[1]:+.4f}, {d[2]:+.4f}]")
        print(f"| {r['variant']} | {r[METRICS[0]]:.4f} | {r[METRICS[1]]:.4f} | {f(dr)} | {f(dn)} | "
              f"{r['wall_s']:.1f} |")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"cpu": cpu, "method": a.method, "study": a.study, "checkpoint": str(ck), "rows": rows}, fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
