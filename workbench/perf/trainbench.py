"""`workbench trainbench FILE.yaml --method M`: a study's real training steps, timed by phase, in one process.

Why: a study's cost is its training (one ML-1M seed was ~6.9 process-hours on 2 cores), and a change that makes
training faster has to be measured on the windows, batches and model the study trains, not on a toy. Here the
steps are the study's own: the experiment file's data stages (cached), one method's first-epoch windows and
batches, its backbone and optimizer, and the training loop's own step (`study/train.py: _Training`), driven for a
fixed number of steps instead of epochs. Nothing is validated or saved.

What it prints (and logs as one MLflow run in the experiment `perf`, `perf/record.py`):
- item targets/s, tokens/s and training FLOP/s (counted as `model/flops.py` counts them) over the square-GEMM
  rate measured in the same process and dtype (the share of this CPU's matmul rate the training reaches);
- the step's wall time by phase (collate, forward, backward, optimizer) and, from `--profile-steps` steps under
  `torch.profiler`, each phase's time by op kind (`OP_KINDS`: matmul, attention, loss, casts, fills,
  elementwise) and what is left (Python and framework overhead: the phase's wall minus its ops' own times);
- with `--ab A B`: two training configurations (comma-separated `section.key=value` overrides of the file, e.g.
  `training.batch_targets=4096,training.lr_grid=[0.004]`; an empty string is the file as it is), both built in
  this process, run in alternating rounds of `--round-steps` steps (the order swapped every round), so each pair
  of rounds sees the same host load; the answer is the median and quartiles of the per-round ratio B / A of time
  per item target (below 1: B trains faster), as the engine's `microbench --ab` does for requests.

Item targets are the comparable unit: every method and batch size trains the same targets per epoch
(`windows.target_batches`), so time per target is what an epoch costs. Threads: what one training worker of the
study gets (`stages/train.py: threads_per_worker`) unless `--threads`.

    workbench trainbench experiments/personalization_ml1m.yaml --method text_history --steps 20
    workbench trainbench experiments/personalization_ml1m.yaml --method none \\
        --ab "" "training.batch_targets=4096,training.lr_grid=[0.004]" --rounds 6
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from workbench.errors import UsageError
from workbench.perf import record
from workbench.perf.abbench import quartiles

PHASES = ("collate", "forward", "backward", "optimizer")
# op kind -> substrings of aten op names (first match wins; everything else is "elementwise")
OP_KINDS: dict[str, tuple[str, ...]] = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm",
               "mkldnn", "onednn"),
    "attention": ("scaled_dot_product", "flash_attention", "efficient_attention", "flex_attention"),
    "loss": ("log_softmax", "nll_loss", "cross_entropy", "logsumexp"),
    "casts": ("aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous"),
    "fills": ("aten::zero_", "aten::fill_", "aten::zeros", "aten::full", "aten::empty", "aten::ones"),
}
OTHER_KIND = "elementwise"
ENGINE = "torch training"  # the `engine` of a document, as the engine benchmarks name theirs
# a phase's wall time its aten ops do not account for (Python, dispatch, autograd bookkeeping; under training.compile
# also inductor's fused kernels, which are not aten ops)
OVERHEAD = "overhead"


def op_kind(name: str) -> str:
    for kind, keys in OP_KINDS.items():
        if any(k in name for k in keys):
            return kind
    return OTHER_KIND


# ---- configurations ---------------------------------------------------------------------------------------------


def parse_overrides(text: str) -> dict:
    """"training.batch_targets=4096,training.lr_grid=[0.004]" -> {"training": {...}} (values read as YAML); a
    UsageError saying what is wrong. Commas inside [] or {} belong to the value."""
    out: dict = {}
    for part in _split_top(text):
        key, sep, value = part.partition("=")
        path = [k for k in key.strip().split(".") if k]
        if not sep or len(path) < 2:
            raise UsageError(f"override {part!r} is not section.key=value (e.g. training.batch_targets=4096)")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise UsageError(f"override {part!r}: the value is not YAML ({e})") from None
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = parsed
    return out


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


@dataclass
class Side:
    """One training configuration under test: its label, overrides, config and live training run."""

    label: str
    overrides: dict
    cfg: Any
    run: Any  # a started training run (study.outputs.training_run: the grid's first learning rate)
    next_batch: int = 0

    def batch(self):
        idx = self.run.batches[self.next_batch % len(self.run.batches)]
        self.next_batch += 1
        return idx


def build_side(label: str, file: str, overrides: dict, method: str, seed: int, inp_cache: dict) -> Side:
    """The study's training run for `method` under `file` + `overrides` (data stages from the cache), started."""
    from workbench.config import load_study
    from workbench.study.outputs import inputs_from_context, prepare_context, study_methods, training_run

    cfg = load_study(file, overrides=overrides or None)

    if method not in study_methods(cfg.methods):
        raise UsageError(f"--method {method!r} is not among {file}'s methods {list(study_methods(cfg.methods))} "
                         "(methods.run and the methods.contexts variants)")
    key = json.dumps(cfg.model_dump(mode="json", exclude={"training", "evaluation", "tracking"}), sort_keys=True)
    if key not in inp_cache:  # two sides with the same data sections share one set of study inputs
        inp_cache[key] = inputs_from_context(prepare_context(cfg))
    with tempfile.TemporaryDirectory(prefix="trainbench-") as folder:  # nothing is saved: the folder stays empty
        run = training_run(cfg, inp_cache[key], method, seed, Path(folder))
    return Side(label, overrides, cfg, run)


# ---- timing -----------------------------------------------------------------------------------------------------


class Clock:
    """`mark(phase)` adds the seconds since the previous mark (or `start`) to that phase. With `ranges`, each phase is
    also a `torch.profiler` range, wb::<phase>, that `profiled_ops` attributes the ops by (the marks come in `PHASES`
    order: `_Training.optimizer_step`'s)."""

    def __init__(self, ranges: bool = False):
        self.s: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.ranges, self._open, self._i = ranges, None, 0
        self.t = time.perf_counter()

    def start(self) -> None:
        self.t = time.perf_counter()
        if self.ranges:
            self._enter(0)

    def _enter(self, i: int) -> None:
        from torch.autograd.profiler import record_function

        self._i, self._open = i, record_function(f"wb::{PHASES[i]}")
        self._open.__enter__()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.s[phase] += now - self.t
        self.t = now
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None
            if self._i + 1 < len(PHASES):
                self._enter(self._i + 1)


def timed_steps(side: Side, steps: int) -> dict:
    """`steps` optimizer steps of `side`: wall, targets, tokens, FLOPs and seconds per phase."""
    run = side.run
    targets_per_window = run.ws.targets_per_window()
    tok0, fl0 = run.tokens, run.flops
    clock, targets = Clock(), 0
    t0 = time.perf_counter()
    for _ in range(steps):
        idx = side.batch()
        targets += int(targets_per_window[idx].sum())
        clock.start()
        run.optimizer_step(idx, clock.mark)
    wall = time.perf_counter() - t0
    return {"steps": steps, "wall_s": wall, "targets": targets, "tokens": run.tokens - tok0,
            "flops": run.flops - fl0, "phase_s": dict(clock.s)}


def profiled_ops(side: Side, steps: int) -> dict[str, dict[str, float]]:
    """ms per step by phase and op kind over `steps` profiled steps (op self times; each phase's wall time not
    covered by its ops is `OVERHEAD`)."""
    from torch.profiler import ProfilerActivity, profile

    clock = Clock(ranges=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            idx = side.batch()
            clock.start()
            side.run.optimizer_step(idx, clock.mark)
    out: dict[str, dict[str, float]] = {p: {} for p in PHASES}
    for ev in prof.events():
        if ev.name.startswith("wb::") or not ev.name.startswith("aten::") and "mkldnn" not in ev.name:
            continue
        phase = _phase_of(ev)
        if phase is None:
            continue
        kind = op_kind(ev.name)
        out[phase][kind] = out[phase].get(kind, 0.0) + ev.self_cpu_time_total / 1000.0  # us -> ms
    for phase in PHASES:
        ops = sum(out[phase].values())
        out[phase] = {k: v / steps for k, v in sorted(out[phase].items(), key=lambda kv: -kv[1])}
        out[phase][OVERHEAD] = max(0.0, clock.s[phase] * 1000.0 - ops) / steps
    return out


def _phase_of(ev) -> str | None:
    node = ev.cpu_parent
    while node is not None:
        if node.name.startswith("wb::"):
            return node.name[4:]
        node = node.cpu_parent
    return None


def summarize(side: Side, m: dict, peak_gflops: float) -> dict:
    """One configuration's document: rates, the matmul share, ms per step by phase."""
    run = side.run
    wall = max(m["wall_s"], 1e-9)
    flops_per_s = m["flops"] / wall
    per_step = {p: s * 1000.0 / m["steps"] for p, s in m["phase_s"].items()}
    return {
        "label": side.label, "overrides": side.overrides, "method": run.method, "lr": run.st.lr, "engine": ENGINE,
        "dtype": "bfloat16" if run.use_bf16 else "float32", "bf16_info": run.bf16_info,
        "batch_targets": side.cfg.training.batch_targets, "steps": m["steps"], "targets": m["targets"],
        "tokens": m["tokens"], "wall_s": m["wall_s"], "ms_per_step": wall * 1000.0 / m["steps"],
        "targets_per_s": m["targets"] / wall, "tokens_per_s": m["tokens"] / wall,
        "train_gflops_per_s": flops_per_s / 1e9, "matmul_gflops": peak_gflops,
        "matmul_share": flops_per_s / (peak_gflops * 1e9),
        "matmul_floor_ms_per_step": m["flops"] / m["steps"] / (peak_gflops * 1e9) * 1000.0,
        "phase_ms_per_step": per_step,
    }  # fmt: skip


# ---- the two modes ----------------------------------------------------------------------------------------------


def bench_one(args, file: str, overrides: dict) -> dict:
    side = build_side("A", file, overrides, args.method, args.seed, {})
    if args.warmup_steps:
        timed_steps(side, args.warmup_steps)
    m = timed_steps(side, args.steps)
    doc = summarize(side, m, side.run.peak / 1e9)
    if args.profile_steps:
        doc["ops_ms_per_step"] = profiled_ops(side, args.profile_steps)
    return {"mode": "train", "experiment_file": file, "seed": args.seed, **doc}


def bench_ab(args, file: str, a: dict, b: dict) -> dict:
    cache: dict = {}
    sides = [build_side("A", file, a, args.method, args.seed, cache), build_side("B", file, b, args.method,
                                                                                  args.seed, cache)]
    for s in sides:
        if args.warmup_steps:
            timed_steps(s, args.warmup_steps)
    totals = {s.label: [] for s in sides}
    ratios = []
    for r in range(args.rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        got = {s.label: timed_steps(s, args.round_steps) for s in order}
        for s in sides:
            totals[s.label].append(got[s.label])
        per_target = {k: v["wall_s"] / max(v["targets"], 1) for k, v in got.items()}
        ratios.append(per_target["B"] / per_target["A"])
    docs = []
    for s in sides:
        ms = totals[s.label]
        merged = {"steps": sum(x["steps"] for x in ms), "wall_s": sum(x["wall_s"] for x in ms),
                  "targets": sum(x["targets"] for x in ms), "tokens": sum(x["tokens"] for x in ms),
                  "flops": sum(x["flops"] for x in ms),
                  "phase_s": {p: sum(x["phase_s"][p] for x in ms) for p in PHASES}}
        docs.append(summarize(s, merged, s.run.peak / 1e9))
    if args.profile_steps:
        for s, d in zip(sides, docs):
            d["ops_ms_per_step"] = profiled_ops(s, args.profile_steps)
    return {"mode": "train_ab", "experiment_file": file, "seed": args.seed, "method": args.method,
            "rounds": args.rounds, "round_steps": args.round_steps, "a": docs[0], "b": docs[1],
            "dtype": f"{docs[0]['dtype']} vs {docs[1]['dtype']}", "engine": ENGINE,
            "ratio_b_over_a": dict(zip(("q1", "median", "q3"), quartiles(ratios))), "per_round_ratio": ratios}


# ---- printing ---------------------------------------------------------------------------------------------------


def describe(doc: dict) -> str:
    lines = [f"{doc['label']} {doc['overrides'] or '(the file as it is)'}: {doc['method']}, {doc['dtype']}, "
             f"batch_targets {doc['batch_targets']}, {doc['steps']} steps",
             f"  {doc['targets_per_s']:,.0f} item targets/s, {doc['tokens_per_s']:,.0f} tokens/s, "
             f"{doc['train_gflops_per_s']:.1f} training GFLOP/s = {doc['matmul_share']:.1%} of the "
             f"{doc['matmul_gflops']:.0f} GFLOP/s matmul rate measured here; {doc['ms_per_step']:.1f} ms/step "
             f"(matmul floor {doc['matmul_floor_ms_per_step']:.1f})"]
    total = sum(doc["phase_ms_per_step"].values()) or 1.0
    lines.append("  phases (ms/step): " + ", ".join(f"{p} {v:.1f} ({v / total:.0%})"
                                                    for p, v in doc["phase_ms_per_step"].items()))
    for phase, kinds in doc.get("ops_ms_per_step", {}).items():
        tot = sum(kinds.values()) or 1.0
        lines.append(f"    {phase} (profiled, ms/step): " + ", ".join(f"{k} {v:.1f} ({v / tot:.0%})"
                                                                        for k, v in kinds.items() if v >= 0.05))
    return "\n".join(lines)


def print_doc(doc: dict) -> None:
    if doc["mode"] == "train":
        print(describe(doc))
    else:
        print(describe(doc["a"]))
        print(describe(doc["b"]))
        r = doc["ratio_b_over_a"]
        print(f"B / A time per item target, {doc['rounds']} alternating rounds of {doc['round_steps']} steps: "
              f"median {r['median']:.3f} (quartiles {r['q1']:.3f}-{r['q3']:.3f}); B is "
              f"{1 / r['median']:.2f}x A's speed")
    print(json.dumps(doc))
    sys.stdout.flush()


# ---- command line -----------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench trainbench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("file", help="a study experiment file (its data stages run or load from the cache)")
    p.add_argument("--method", required=True, help="the method whose training steps are timed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=20, help="timed steps (without --ab)")
    p.add_argument("--warmup-steps", type=int, default=2, help="steps run first and not counted")
    p.add_argument("--profile-steps", type=int, default=3, help="steps under torch.profiler for the op kinds (0: none)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: one study training worker's, training.num_threads // workers)")
    p.add_argument("--set", default="", metavar="OVERRIDES",
                   help="overrides of the file, section.key=value,... (without --ab)")
    p.add_argument("--ab", nargs=2, metavar=("A", "B"), default=None,
                   help="two override lists (\"\" = the file as it is), run in alternating rounds")
    p.add_argument("--rounds", type=int, default=6, help="--ab: rounds per side (the order swaps every round)")
    p.add_argument("--round-steps", type=int, default=3, help="--ab: steps per side per round")
    record.add_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from workbench.config import load_study
    from workbench.study.outputs import set_threads, training_threads

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    for flag in ("steps", "rounds", "round_steps"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1")
    if args.warmup_steps < 0 or args.profile_steps < 0:
        raise UsageError("--warmup-steps and --profile-steps must be 0 or more")
    sides = [parse_overrides(x) for x in args.ab] if args.ab else [parse_overrides(args.set)]
    for ov in sides:  # a bad file or override fails here, before anything heavy
        load_study(args.file, overrides=ov or None)
    threads = args.threads or training_threads(load_study(args.file, overrides=sides[0] or None))
    set_threads(threads)
    mode = "train_ab" if args.ab else "train"
    args.model, args.checkpoint, args.dtype = f"{Path(args.file).stem}/{args.method}", None, ""
    with record.perf_run(args, argv, mode, threads, sub="trainbench") as rec:
        doc = RUNNERS[mode](args, args.file, *sides)
        doc["threads"] = threads
        print_doc(doc)
        rec.log([doc])
    return 0


RUNNERS: dict[str, Callable] = {"train": bench_one, "train_ab": bench_ab}
