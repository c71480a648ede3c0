"""The performance runs' part of the report, read back from what `workbench microbench` logs (perf/record.py).

A performance run is a top-level run tagged `workbench.stage = perf`, one per invocation of any mode (the
side-by-side default, `--floor`, `--ab`). Its row in the table comes from its tags (mode, command, model,
dtype, threads, CPU, commit) and from `perf.json`, the JSON documents it printed, through the same
`record.HEADLINES` that named its metrics: one row per document (a `--floor --dtype both` run has two).
The figures: each floor result's engine time (prefill forward, decode forwards, the rest) beside its kernel
floor and matmul floor by phase, and each A/B run's per-request ratio with its quartiles.

Nothing is recomputed: a number in the report is a number a run logged.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import names
from workbench.perf import record

PHASES = ("prefill_gemm", "prefill_attention", "decode_gemm", "decode_attention", "lm_head")  # floorbench's
ENGINE_PARTS = (("engine_prefill_forward_ms", "prefill forward"), ("engine_decode_forwards_ms", "decode forwards"),
                ("engine_other_ms", "selection / scheduling"))
# the command line last: it is long (a checkpoint path), and the numbers stay in view before it
TABLE_COLUMNS = ["date", "mode", "model", "dtype", "threads", "ms", "vs ms", "ratio", "ratio is", "CPU", "commit",
                 "status", "command"]


@dataclass
class PerfRuns:
    """The performance runs of the experiment(s): one table row per printed result, the floor and A/B results."""

    runs: list[dict] = field(default_factory=list)  # one per run: label, ids, tags, config, environment, results
    table: Any = None  # one row per (run, printed result)
    floors: list[dict] = field(default_factory=list)  # `--floor` results, each with its run's `label`
    abs: list[dict] = field(default_factory=list)  # `--ab` results, each with its run's `label`


def is_perf_run(run) -> bool:
    return run.data.tags.get(names.TAG_STAGE) == names.STAGE_PERF


def _latest_per_command(runs) -> list:
    """The most recent run of each command line in each experiment (a re-run otherwise shows twice)."""
    latest: dict[tuple[str, str], Any] = {}
    for r in runs:
        key = (r.info.experiment_id, r.data.tags.get(names.TAG_COMMAND, r.info.run_id))
        if key not in latest or r.info.start_time > latest[key].info.start_time:
            latest[key] = r
    return list(latest.values())


def collect_perf_runs(runs, latest: bool, load_artifact) -> PerfRuns:
    """The performance runs among `runs`, newest first; `latest` keeps the most recent of each command line.
    `load_artifact(run_id, path)`: a JSON artifact as a dict, or None (html.py's reader)."""
    import pandas as pd

    perf = sorted((r for r in runs if is_perf_run(r)), key=lambda r: -r.info.start_time)
    if latest:
        perf = sorted(_latest_per_command(perf), key=lambda r: -r.info.start_time)
    out = PerfRuns()
    rows = []
    for r in perf:
        t = r.data.tags
        when = _dt.datetime.fromtimestamp(r.info.start_time / 1000)
        mode = t.get(names.TAG_PERF_MODE, "")
        model = t.get(names.TAG_MODEL_SIZE) or Path(t.get(names.TAG_CHECKPOINT, "")).name  # a size, or its folder
        label = f"{mode} {model} {when:%m-%d %H:%M}"
        doc = load_artifact(r.info.run_id, record.ARTIFACT) or {}
        results = doc.get("results") or []
        out.runs.append({"label": label, "run_id": r.info.run_id, "status": r.info.status, "mode": mode,
                         "command": t.get(names.TAG_COMMAND, ""), "commit": t.get(names.TAG_GIT_COMMIT, ""),
                         "cpu": t.get(names.TAG_CPU, ""), "start": when.isoformat(timespec="seconds"),
                         "error": t.get(names.TAG_ERROR, ""), "config": load_artifact(r.info.run_id, "config.json"),
                         "environment": load_artifact(r.info.run_id, "environment.json")})  # fmt: skip
        base = {"date": f"{when:%Y-%m-%d %H:%M}", "mode": mode, "command": t.get(names.TAG_COMMAND, ""),
                "model": model, "threads": t.get(names.TAG_THREADS, ""), "CPU": t.get(names.TAG_CPU, ""),
                "commit": t.get(names.TAG_GIT_COMMIT, "")[:12], "status": r.info.status, "run_id": r.info.run_id}
        if not results:  # a run that failed before it printed: its row says so
            rows.append({**base, "dtype": t.get(names.TAG_DTYPE, "")})
        for res in results:
            rows.append({**base, "dtype": _dtype(mode, res), **_summary(mode, res)})
            if mode == "floor":
                out.floors.append({**res, "label": f"{label} {res.get('dtype', '')}"})
            elif mode == "ab":
                out.abs.append({**res, "label": label})
    out.table = pd.DataFrame(rows, columns=TABLE_COLUMNS + ["run_id"]) if rows else pd.DataFrame(rows)
    return out


def _dtype(mode: str, res: dict) -> str:
    if mode == "ab":
        return " vs ".join(str(res.get(s, {}).get("dtype", "")) for s in ("a", "b"))
    return str(res.get("dtype", ""))


def _summary(mode: str, res: dict) -> dict:
    """The table's time, the time it is compared with, their ratio and what the ratio is (record.SUMMARY)."""
    if mode not in record.SUMMARY:
        return {}
    ms, vs, ratio, what = record.SUMMARY[mode]
    h = record.headline(mode, res)
    return {"ms": h.get(ms), "vs ms": h.get(vs), "ratio": h.get(ratio), "ratio is": what}


def figures(p: PerfRuns) -> dict[str, Any]:
    """The floor figure (engine time vs the floors, by phase) and the A/B figure, where such runs exist."""
    figs: dict[str, Any] = {}
    if p.floors:
        figs["perf: engine time vs compute floor, by phase"] = floor_figure(p.floors)
    if p.abs:
        figs["perf: A/B per-request ratio"] = ab_figure(p.abs)
    return figs


def floor_figure(floors: list[dict]):
    """Stacked bars per floor result: the engine's request (its parts), the kernel floor and the matmul floor
    (each by phase), side by side on one millisecond axis."""
    import plotly.graph_objects as go

    fig = go.Figure()
    labels = [f["label"] for f in floors]
    for key, name in ENGINE_PARTS:
        fig.add_bar(name=f"engine: {name}", x=[labels, ["engine"] * len(labels)],
                    y=[f.get(key) for f in floors])
    for phase in PHASES:
        ph = [{p["name"]: p for p in f.get("phases", [])}.get(phase, {}) for f in floors]
        fig.add_bar(name=phase, x=[labels * 2, ["kernel floor"] * len(labels) + ["matmul floor"] * len(labels)],
                    y=[p.get("kernel_ms") for p in ph] + [p.get("matmul_floor_ms") for p in ph])
    fig.update_layout(barmode="stack", yaxis_title="ms per beam request", legend_title="part / phase",
                      margin={"t": 30})
    return fig


def ab_figure(abs_: list[dict]):
    """The median per-request B / A of each A/B run with its quartiles; 1 (no change) as a line."""
    import plotly.graph_objects as go

    r = [a["ratio_b_over_a"] for a in abs_]
    fig = go.Figure(go.Scatter(
        x=[a["label"] for a in abs_], y=[x["median"] for x in r], mode="markers", name="B / A (median)",
        error_y={"type": "data", "symmetric": False, "array": [x["q3"] - x["median"] for x in r],
                 "arrayminus": [x["median"] - x["q1"] for x in r]},
        text=[f"A {a['a']} vs B {a['b']}" for a in abs_]))  # fmt: skip
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(yaxis_title="B / A per request (median, quartiles)", margin={"t": 30})
    return fig
