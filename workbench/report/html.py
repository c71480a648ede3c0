"""Shared HTML reports built from MLflow only: `workbench report --experiment NAME -o FILE`.

The report is one standalone HTML file a colleague can open without the workbench, MLflow or a
network: plotly figures inline (plotly.js embedded once), tables, the sweep configs, package
versions, hardware and git commits. It reads runs; it never trains or sends load.

What it joins, and what it refuses to join:

- Load runs (`workbench.stage = load`, written by `bench.py`) are grouped by workload tag; a figure
  never mixes workloads, and series within a workload are the runs' (engine label, method).
- Quality for the Pareto plots comes from runs with `quality/*` metrics whose tags match the load
  run on every key of `JOIN_TAGS` (checkpoint, engine, mode, dtype): quality measured on another
  engine, mode or dtype is not the quality of that load run. `check_joinable` raises
  `IncomparableRuns` naming the differing tags; the report lists every run it did not join and why.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from workbench import names
from workbench.errors import UsageError
from workbench.load.metrics import METRIC_NAMES

JOIN_TAGS: tuple[str, ...] = (names.TAG_CHECKPOINT, names.TAG_ENGINE, names.TAG_MODE, names.TAG_DTYPE)
COMPARE_TAGS: tuple[str, ...] = JOIN_TAGS + (names.TAG_WORKLOAD,)

def default_quality_metric() -> str:
    """The quality column of the Pareto plots: Recall@10 as logged in MLflow."""
    return names.metric_name(names.recall_at(10))


class ReportError(UsageError, ValueError):
    """A report that cannot be written as asked (unknown experiment, output path); the message says how to fix it."""


class IncomparableRuns(ValueError):
    """Two runs were asked to be compared or joined although they differ in a tag that must match."""


def check_joinable(a: dict[str, str], b: dict[str, str], keys: tuple[str, ...] = JOIN_TAGS) -> None:
    """Raise IncomparableRuns unless tag dicts `a` and `b` agree on every key (a missing tag is a mismatch)."""
    diff = {k: (a.get(k), b.get(k)) for k in keys if a.get(k) is None or a.get(k) != b.get(k)}
    if diff:
        text = "; ".join(f"{k}: {x!r} vs {y!r}" for k, (x, y) in diff.items())
        raise IncomparableRuns(f"runs differ in {text}; measure both on the same checkpoint/engine/mode/dtype/workload")


@dataclass
class Study:
    """Everything the report shows, as DataFrames (notebooks use this directly)."""

    experiment: str
    tracking_uri: str
    summary: Any  # one row per load run
    points: Any  # one row per (load run, rate point)
    quality: Any  # one row per quality run
    joined: Any  # summary rows with a quality column where the tags matched
    not_joined: list[str] = field(default_factory=list)
    parents: list[dict] = field(default_factory=list)  # sweep runs: name, id, commit, config, environment


def _client():
    from workbench.tracking import _mlflow, tracking_uri

    _mlflow()
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri()), tracking_uri()


def _load_artifact_dict(client, run_id: str, path: str) -> dict | None:
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as d:
            local = client.download_artifacts(run_id, path, d)
            return json.loads(Path(local).read_text())
    except Exception:  # noqa: BLE001 - an older run without the artifact
        return None


def _metric_history_points(client, run) -> list[dict]:
    rows: dict[int, dict] = {}
    for col, key in METRIC_NAMES.items():
        if key not in run.data.metrics:
            continue
        for m in client.get_metric_history(run.info.run_id, key):
            rows.setdefault(m.step, {"step": m.step})[col] = m.value
    return [rows[s] for s in sorted(rows)]


def _latest_sweeps(runs) -> set[str]:
    """Run ids of the most recent load sweep (parent run) of each experiment among `runs`."""
    latest: dict[str, Any] = {}
    for r in runs:
        if r.data.tags.get(names.TAG_STAGE) == names.STAGE_LOAD_SWEEP:
            cur = latest.get(r.info.experiment_id)
            if cur is None or r.info.start_time > cur.info.start_time:
                latest[r.info.experiment_id] = r
    return {r.info.run_id for r in latest.values()}


def collect_study(experiment: str | Sequence[str], quality_metric: str | None = None, latest: bool = False) -> Study:
    """Read every run of MLflow experiment(s) `experiment` into a Study (load summary, points, quality, join).

    Several experiments can be read together, e.g. a load sweep and the quality study whose
    evaluation runs give the Pareto plots their quality axis. With `latest`, only the most recent
    sweep of each experiment is read (re-running a sweep otherwise puts both runs of every series
    in the figures); quality runs are all kept.
    """
    quality_metric = quality_metric or default_quality_metric()
    import pandas as pd

    client, uri = _client()
    exp_names = [experiment] if isinstance(experiment, str) else list(experiment)
    exp_ids = []
    for name in exp_names:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            known = sorted(e.name for e in client.search_experiments())
            raise ReportError(f"no MLflow experiment {name!r} in {uri}; experiments there: {known} "
                              "(MLFLOW_TRACKING_URI selects the store)")
        exp_ids.append(exp.experiment_id)
    runs = client.search_runs(exp_ids, max_results=10000)
    keep = _latest_sweeps(runs) if latest else None
    summary, points, quality, parents = [], [], [], []
    for r in runs:
        t, m = r.data.tags, r.data.metrics
        stage = t.get(names.TAG_STAGE)
        if keep is not None and stage in (names.STAGE_LOAD, names.STAGE_LOAD_SWEEP):
            sweep = r.info.run_id if stage == names.STAGE_LOAD_SWEEP else t.get("mlflow.parentRunId")
            if sweep not in keep:
                continue
        if stage == names.STAGE_LOAD:
            row = _summary_row(r)
            summary.append(row)
            if r.info.status == "FINISHED":
                for p in _metric_history_points(client, r):
                    points.append({"run_id": r.info.run_id, "series": row["series"], "engine": row["engine"],
                                   "method": row["method"], "workload": row["workload"], **p})  # fmt: skip
        elif stage == names.STAGE_LOAD_SWEEP:
            parents.append({
                "name": t.get("mlflow.runName", ""), "run_id": r.info.run_id, "status": r.info.status,
                "commit": t.get(names.TAG_GIT_COMMIT, "unknown"), "slo_source": t.get(names.TAG_SLO_SOURCE, ""),
                "start": _dt.datetime.fromtimestamp(r.info.start_time / 1000).isoformat(timespec="seconds"),
                "config": _load_artifact_dict(client, r.info.run_id, "config.json"),
                "environment": _load_artifact_dict(client, r.info.run_id, "environment.json"),
            })  # fmt: skip
        elif (any(k.startswith("quality/") for k in m) and r.info.status == "FINISHED"
              and t.get(names.TAG_SIGNAL, "own") == "own"):  # a load run replays the method's own signal
            q = {k: t.get(k) for k in COMPARE_TAGS}
            q.update({"run_id": r.info.run_id, "run_name": t.get("mlflow.runName", ""),
                      "method": t.get(names.TAG_METHOD)})
            q.update({k: v for k, v in m.items() if k.startswith("quality/") or k.startswith("prompt/")})
            quality.append(q)
    summary_df = pd.DataFrame(summary)
    points_df = pd.DataFrame(points)
    quality_df = pd.DataFrame(quality)
    joined, not_joined = join_quality(summary_df, quality_df, quality_metric)
    return Study(", ".join(exp_names), uri, summary_df, points_df, quality_df, joined, not_joined,
                 sorted(parents, key=lambda p: p["start"]))  # fmt: skip


def _summary_row(r) -> dict:
    t, m = r.data.tags, r.data.metrics
    sat = m.get(names.SATURATION_QPS)
    return {
        "series": t.get(names.TAG_SERIES, t.get(names.TAG_ENGINE, "?")), "engine": t.get(names.TAG_ENGINE),
        "method": t.get(names.TAG_METHOD), "workload": t.get(names.TAG_WORKLOAD), "mode": t.get(names.TAG_MODE),
        "dtype": t.get(names.TAG_DTYPE), "checkpoint": t.get(names.TAG_CHECKPOINT),
        "transport": t.get(names.TAG_TRANSPORT), "status": r.info.status, "run_id": r.info.run_id,
        "unloaded_p50_ms": m.get("latency/unloaded_p50_ms", math.nan), "slo_ms": m.get("load/slo_ms", math.nan),
        "saturation_qps": sat if sat else math.nan,
        "usd_per_1m": m.get(names.COST_PER_1M, math.inf), "relative_cost": m.get(names.COST_RELATIVE, math.nan),
        "relative_cost_method": m.get(names.COST_RELATIVE_METHOD, math.nan),
        "client_cpu_share_max": m.get("load/client_cpu_share_max", math.nan),
        "error": t.get(names.TAG_ERROR, ""),
        "tags": {k: t.get(k) for k in COMPARE_TAGS},
    }  # fmt: skip


def join_quality(summary, quality, quality_metric: str | None = None):
    """Attach `quality_metric` to load rows whose JOIN_TAGS all match one quality run; list the rest."""
    quality_metric = quality_metric or default_quality_metric()
    import pandas as pd

    if len(summary) == 0:
        return summary.copy(), []
    joined = summary.copy()
    joined[quality_metric] = math.nan
    notes: list[str] = []
    qrows = quality.to_dict("records") if len(quality) else []
    for i, row in joined.iterrows():
        if row["status"] != "FINISHED":
            continue
        matches, reasons = [], []
        for q in qrows:
            v = q.get(quality_metric)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            try:
                check_joinable(row["tags"], {k: q.get(k) for k in JOIN_TAGS})
                matches.append(q)
            except IncomparableRuns as e:
                if q.get(names.TAG_CHECKPOINT) == row["tags"].get(names.TAG_CHECKPOINT):
                    reasons.append(f"{q['run_name'] or q['run_id']}: {e}")
        if matches:
            joined.at[i, quality_metric] = float(matches[-1][quality_metric])
        else:
            why = "; ".join(reasons) if reasons else "no quality run on this checkpoint"
            notes.append(f"{row['series']} / {row['method']} / {row['workload']}: not joined ({why})")
    return pd.DataFrame(joined), notes


def common_rate_p99(points, summary) -> tuple[float, dict[str, float]]:
    """p99 of every finished series at one common achieved rate (the lowest saturation QPS among them)."""
    import numpy as np

    sats = summary["saturation_qps"].dropna()
    sats = sats[sats > 0]
    if len(points) == 0 or len(sats) == 0:
        return math.nan, {}
    rate = float(sats.min())
    out = {}
    for rid, df in points.groupby("run_id"):
        df = df.sort_values("achieved_qps")
        if rate < df["achieved_qps"].min() or rate > df["achieved_qps"].max():
            continue
        out[rid] = float(np.interp(rate, df["achieved_qps"], df["e2e_p99_ms"]))
    return rate, out


def figures(study: Study, quality_metric: str | None = None) -> dict[str, Any]:
    """The report's figures by title: per workload latency/throughput/cost, then the Pareto plots."""
    quality_metric = quality_metric or default_quality_metric()
    from workbench.load import plots

    figs: dict[str, Any] = {}
    s = study.summary
    if len(s) == 0:
        return figs
    fin = s[s["status"] == "FINISHED"]
    for wl, g in fin.groupby("workload", sort=False):
        pts = study.points[study.points["workload"] == wl] if len(study.points) else study.points
        slo = float(g["slo_ms"].dropna().iloc[0]) if g["slo_ms"].notna().any() else None
        if len(pts):
            pts = _series_with_method(pts)
            t1, t2 = f"{wl}: latency vs achieved QPS", f"{wl}: throughput vs offered rate"
            figs[t1] = plots.latency_vs_qps(pts, slo, title=t1)
            figs[t2] = plots.throughput_vs_offered(pts, title=f"{wl}: achieved vs offered")
        figs[f"{wl}: cost per 1M requests"] = plots.cost_bars(_series_with_method(g), title=f"{wl}: $ per 1M requests")
    j = study.joined
    if len(j) and quality_metric in j and j[quality_metric].notna().any():
        rate, p99 = common_rate_p99(study.points, j)
        jj = j.copy()
        jj["e2e_p99_ms"] = jj["run_id"].map(p99)
        figs["quality vs cost"] = plots.quality_pareto(jj, quality_metric, "usd_per_1m", "USD per 1M requests")
        figs["quality vs p99 latency"] = plots.quality_pareto(jj, quality_metric, "e2e_p99_ms",
                                                              f"p99 latency at {rate:.3g} req/s (ms)")  # fmt: skip
    return figs


def _series_with_method(df):
    df = df.copy()
    if df["method"].nunique() > 1:
        df["series"] = df["series"] + " · " + df["method"].astype(str)
    return df


# ---- HTML ----------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}pre{background:#f7f7f7;padding:1em;overflow:auto;
font-size:12px;max-height:30em}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}.note{color:#555}
"""

_SUMMARY_COLS = ["series", "method", "workload", "mode", "dtype", "transport", "unloaded_p50_ms", "slo_ms",
                 "saturation_qps", "usd_per_1m", "relative_cost", "relative_cost_method", "client_cpu_share_max",
                 "status"]  # fmt: skip


def _table(df, cols=None, floatfmt="{:.4g}") -> str:
    if df is None or len(df) == 0:
        return "<p class='note'>(none)</p>"
    d = df[[c for c in (cols or df.columns) if c in df.columns]].copy()
    return d.to_html(index=False, escape=True, na_rep="-", float_format=lambda x: floatfmt.format(x), border=0)


def render_html(study: Study, quality_metric: str | None = None) -> str:
    import plotly.io as pio
    quality_metric = quality_metric or default_quality_metric()

    figs = figures(study, quality_metric)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(study.experiment)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>Workbench report: {html.escape(study.experiment)}</h1>",
             f"<p class='note'>Generated {_dt.datetime.now().isoformat(timespec='seconds')} from MLflow store "
             f"<code>{html.escape(study.tracking_uri)}</code>. Saturation QPS = the highest achieved rate whose p99 is "
             "inside the SLO with no failures; $ per 1M = hourly price / (saturation QPS x 3600) x 1e6.</p>",
             ]  # fmt: skip
    parts.append("<h2>Summary</h2>")
    parts.append(_table(study.summary, _SUMMARY_COLS))
    failed = study.summary[study.summary["status"] != "FINISHED"] if len(study.summary) else study.summary
    if len(failed):
        cols = ["series", "method", "workload", "status", "error"]
        parts.append("<h3>Runs that did not finish</h3>" + _table(failed, cols))
    parts.append("<h2>Figures</h2>")
    first = True
    for title, fig in figs.items():
        parts.append(f"<h3>{html.escape(title)}</h3>")
        parts.append(pio.to_html(fig, include_plotlyjs=first, full_html=False, default_height=480))
        first = False
    if not figs:
        parts.append("<p class='note'>No finished load runs in this experiment.</p>")
    parts.append(f"<h2>Quality join ({html.escape(quality_metric)})</h2>")
    parts.append(f"<p class='note'>Quality is joined to a load run only when {', '.join(JOIN_TAGS)} all match.</p>")
    if len(study.joined) and quality_metric in study.joined:
        parts.append(_table(study.joined[study.joined[quality_metric].notna()],
                            ["series", "method", "mode", "dtype", quality_metric, "usd_per_1m",
                             "saturation_qps"]))  # fmt: skip
    if study.not_joined:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in study.not_joined) + "</ul>")
    parts.append("<h2>Rate points</h2>")
    parts.append(_table(study.points, ["series", "method", "workload", "step", "offered_qps", "achieved_qps",
                                       "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms", "ttft_p50_ms", "failures",
                                       "goodput_qps", "client_cpu_share", "loop_cpu_share"]))  # fmt: skip
    parts.append("<h2>Sweeps: config, versions, hardware, commit</h2>")
    for p in study.parents:
        parts.append(f"<h3>{html.escape(p['name'])} <small>({html.escape(p['start'])}, run {p['run_id']}, "
                     f"{html.escape(p['status'])})</small></h3>")  # fmt: skip
        parts.append(f"<p>commit <code>{html.escape(p['commit'])}</code>; SLO: {html.escape(p['slo_source'])}</p>")
        for key in ("environment", "config"):
            if p.get(key):
                parts.append(f"<details><summary>{key}</summary><pre>{html.escape(json.dumps(p[key], indent=2))}</pre>"
                             "</details>")  # fmt: skip
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(experiment_name: str | Sequence[str], out_path: str | Path, quality_metric: str | None = None,
                 latest: bool = False) -> Path:
    """Write the standalone HTML report of MLflow experiment(s) `experiment_name` to `out_path`.

    A comma-separated name ("beam_search_load,quickstart") reads several experiments together;
    `latest` keeps only the most recent load sweep of each (see `collect_study`).
    """
    quality_metric = quality_metric or default_quality_metric()
    if isinstance(experiment_name, str):
        experiment_name = [n.strip() for n in experiment_name.split(",") if n.strip()]
    out = Path(out_path)
    if out.is_dir():  # checked first: reading the runs can take a while
        raise ReportError(f"report output {out} is a directory; give a file path, e.g. {out / 'report.html'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot write the report to {out}: {e.strerror or e} ({e.filename or out.parent})") from None
    study = collect_study(experiment_name, quality_metric, latest=latest)
    try:
        out.write_text(render_html(study, quality_metric), encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write the report to {out}: {e.strerror or e}") from None
    return out
