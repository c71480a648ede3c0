"""Performance runs recorded like studies: one MLflow run per `workbench microbench` invocation, whichever mode.

Why: a benchmark that only prints leaves its numbers in a terminal, to be pasted into the docs by hand and
compared with runs on other machines from memory. Here each invocation opens one self-describing run through
`workbench.tracking` (the same helper as studies and load sweeps: git commit, CPU and its instruction sets,
package versions, hardware): its arguments as params, `workbench.stage = perf` and the mode, model, dtype and
thread count as tags, the JSON document(s) it printed as `perf.json`, and the headline numbers as `perf/*`
metrics (`HEADLINES`; one per dtype where `--floor --dtype both` measured two). `workbench report` shows them
(`report/perf.py`).

The run goes to the MLflow experiment `perf` (`--experiment` names another) in the store `--tracking-uri`
or the environment selects (`tracking.use`); `--no-track` records nothing, and prints the same.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Callable, Iterator

from workbench import names

# per mode: metric -> how to read it from the mode's JSON document (the one place both logging and report use)
HEADLINES: dict[str, dict[str, Callable[[dict], float]]] = {
    "microbench": {
        names.PERF_BEAM_MS: lambda d: d["beam_torch_s_per_req"] * 1000,
        names.PERF_BEAM_HF_MS: lambda d: d["beam_hf_s_per_req"] * 1000,
        names.PERF_BEAM_SPEEDUP: lambda d: d["beam_speedup"],
        names.PERF_SCORE_SPEEDUP: lambda d: d["score_speedup"],
        names.PERF_SOFT_TOKEN_OVERHEAD: lambda d: d["soft_token_overhead"],
        names.PERF_ROOFLINE_FRACTION: lambda d: d["roofline_fraction"],
        names.PERF_KV_RATIO: lambda d: d["kv_ratio"],
        names.PERF_THROUGHPUT_RATIO: lambda d: d["throughput_ratio"],
        names.PERF_MATMUL_GFLOPS: lambda d: d["matmul_gflops"],
    },
    "floor": {
        names.PERF_ENGINE_MS: lambda d: d["engine_ms"],
        names.PERF_PREFILL_MS: lambda d: d["engine_prefill_forward_ms"],
        names.PERF_DECODE_MS: lambda d: d["engine_decode_forwards_ms"],
        names.PERF_MATMUL_FLOOR_MS: lambda d: d["matmul_floor_ms"],
        names.PERF_KERNEL_FLOOR_MS: lambda d: d["kernel_floor_ms"],
        names.PERF_ENGINE_OVER_FLOOR: lambda d: d["engine_over_matmul_floor"],
        names.PERF_MATMUL_GFLOPS: lambda d: d["matmul_gflops"],
    },
    "train": {
        names.PERF_TRAIN_MS_PER_STEP: lambda d: d["ms_per_step"],
        names.PERF_TRAIN_FLOOR_MS_PER_STEP: lambda d: d["matmul_floor_ms_per_step"],
        names.PERF_TRAIN_TARGETS_PER_S: lambda d: d["targets_per_s"],
        names.PERF_TRAIN_TOKENS_PER_S: lambda d: d["tokens_per_s"],
        names.PERF_TRAIN_MATMUL_SHARE: lambda d: d["matmul_share"],
        names.PERF_MATMUL_GFLOPS: lambda d: d["matmul_gflops"],
    },
    "train_ab": {
        names.PERF_A_MS_PER_KTARGET: lambda d: 1e6 / d["a"]["targets_per_s"],
        names.PERF_B_MS_PER_KTARGET: lambda d: 1e6 / d["b"]["targets_per_s"],
        names.PERF_B_OVER_A: lambda d: d["ratio_b_over_a"]["median"],
        names.PERF_TRAIN_MATMUL_SHARE: lambda d: d["b"]["matmul_share"],
    },
    "ab": {
        names.PERF_A_MS: lambda d: d["a_median_ms"],
        names.PERF_B_MS: lambda d: d["b_median_ms"],
        names.PERF_B_OVER_A: lambda d: d["ratio_b_over_a"]["median"],
        names.PERF_SAME_BEAMS_SHARE: lambda d: d["same_beams"] / max(d["requests"], 1),
    },
}
# per mode, the report's summary columns: (time ms, the time it is compared with, their ratio, what the ratio is)
SUMMARY: dict[str, tuple[str, str, str, str]] = {
    "microbench": (names.PERF_BEAM_MS, names.PERF_BEAM_HF_MS, names.PERF_BEAM_SPEEDUP,
                   "hf / torch, beam ms per request"),
    "floor": (names.PERF_ENGINE_MS, names.PERF_MATMUL_FLOOR_MS, names.PERF_ENGINE_OVER_FLOOR,
              "engine / matmul floor (median request, paired)"),
    "ab": (names.PERF_B_MS, names.PERF_A_MS, names.PERF_B_OVER_A, "B / A per request (median)"),
    "train": (names.PERF_TRAIN_MS_PER_STEP, names.PERF_TRAIN_FLOOR_MS_PER_STEP, names.PERF_TRAIN_MATMUL_SHARE,
              "training step, its matmul floor, the share of the matmul rate"),
    "train_ab": (names.PERF_B_MS_PER_KTARGET, names.PERF_A_MS_PER_KTARGET, names.PERF_B_OVER_A,
                 "B / A training time per item target (median of rounds)"),
}
ARTIFACT = "perf.json"  # {"mode", "command", "results": [the JSON documents printed, in order]}
_NOT_PARAMS = ("tracking_uri", "no_track")  # where the run goes is not what it measured (and a URI may hold a secret)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """`--experiment`, `--tracking-uri` and `--no-track` on `parser`."""
    parser.add_argument("--experiment", default=names.PERF_EXPERIMENT,
                        help=f"MLflow experiment of the run (default {names.PERF_EXPERIMENT!r})")
    parser.add_argument("--tracking-uri", default=None, metavar="URI",
                        help="MLflow store, e.g. a team server http://host:5000 (default: MLFLOW_TRACKING_URI, "
                             "else the local sqlite store under mlruns/)")
    parser.add_argument("--no-track", action="store_true", help="print only: log no MLflow run")


def headline(mode: str, doc: dict) -> dict[str, float]:
    """The `perf/*` metrics of one printed JSON document of `mode` (a key it lacks is left out)."""
    out = {}
    for metric, read in HEADLINES[mode].items():
        with contextlib.suppress(KeyError, TypeError, ZeroDivisionError):
            out[metric] = float(read(doc))
    return out


def command_line(argv: list[str], sub: str = "microbench") -> str:
    return " ".join(["workbench", sub, *argv])


class Recorder:
    """What a mode measured, logged to its run (`handle`: a `tracking.start_run` handle; None: `--no-track`)."""

    def __init__(self, handle, mode: str, command: str):
        self.handle, self.mode, self.command = handle, mode, command

    def log(self, docs: list[dict]) -> None:
        """The printed JSON documents as `perf.json`, their headline numbers as metrics, their dtype and engine
        as tags."""
        if self.handle is None:
            return
        metrics: dict[str, float] = {}
        for doc in docs:
            for metric, value in headline(self.mode, doc).items():
                metrics[names.per_dtype(metric, doc["dtype"]) if len(docs) > 1 else metric] = value
        self.handle.log_metrics(metrics)
        self.handle.set_tags(_result_tags(self.mode, docs))
        self.handle.log_dict({"mode": self.mode, "command": self.command, "results": docs}, ARTIFACT)


def _result_tags(mode: str, docs: list[dict]) -> dict[str, str]:
    if mode == "ab":  # (train_ab names its two sides' dtypes in its own "dtype")
        (d,) = docs
        opts = {s: ",".join(f"{k}={v}" for k, v in d[s].items()) or "defaults" for s in ("a", "b")}
        return {names.TAG_DTYPE: " vs ".join(str(d[s].get("dtype", "")) for s in ("a", "b")),
                names.TAG_ENGINE: f"A {opts['a']} vs B {opts['b']}"}
    return {names.TAG_DTYPE: ",".join(dict.fromkeys(d["dtype"] for d in docs)),
            names.TAG_ENGINE: ",".join(dict.fromkeys(d["engine"] for d in docs))}


@contextlib.contextmanager
def perf_run(args: argparse.Namespace, argv: list[str], mode: str, threads: int,
             sub: str = "microbench") -> Iterator[Recorder]:
    """One MLflow run around a `workbench <sub>` invocation (microbench, trainbench; module doc); FAILED with the
    error kept if it raises."""
    command = command_line(argv, sub)
    if args.no_track:
        yield Recorder(None, mode, command)
        return
    from workbench import tracking

    model = args.checkpoint or args.model
    tags = {names.TAG_STAGE: names.STAGE_PERF, names.TAG_PERF_MODE: mode, names.TAG_COMMAND: command,
            names.TAG_THREADS: str(threads), names.TAG_DTYPE: args.dtype}
    tags.update({names.TAG_CHECKPOINT: args.checkpoint} if args.checkpoint else {names.TAG_MODEL_SIZE: args.model})
    params = {"mode": mode, "command": command, "threads": threads,
              **{k: v for k, v in vars(args).items() if k not in _NOT_PARAMS}}
    with tracking.use(args.tracking_uri):
        with tracking.start_run(f"{mode} {model}", experiment=args.experiment, config=params, tags=tags) as h:
            yield Recorder(h, mode, command)
        print(tracking.ui_hint(h.run_id), file=sys.stderr)
