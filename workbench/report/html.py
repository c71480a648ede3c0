"""Shared HTML reports built from MLflow only: `workbench report --experiment NAME -o FILE`.

The report is one standalone HTML file a colleague can open without the workbench, MLflow or a
network: plotly figures inline (plotly.js embedded once), tables, the configs, package versions,
hardware and git commits. It reads runs; it never trains or sends load. It shows what the
experiment(s) hold, so one command serves every kind:

- a personalization study (`workbench run`, `studies.py`): the quality table with its intervals
  (vs none, vs the baselines), the same by history-length quartile, per-seed values, learning curves,
  the user-signal ablation, prompt length and cost (quality vs prompt tokens and vs ms/request, a line per method
  across its contexts), SID codebook statistics, and each run's config,
  commit, CPU and versions;
- load sweeps (`workbench bench`): summary, latency / throughput / cost figures, rate points, configs;
- both (comma-joined experiments): also quality vs cost and vs p99 latency with the Pareto front;
- a method x engine matrix (a sweep with `load.quality_users`, `load/matrix.py`): cost per cell as a heatmap,
  quality through each engine with its agreement with torch, one Pareto front per engine, how each feature ran;
- performance runs (`workbench microbench`, every mode, `perf.py`): a table of their headline times and
  ratios with the CPU and commit each ran on, engine time vs the compute floor by phase, A/B ratios.

What it joins, and what it refuses to join:

- Load runs (`workbench.stage = load`, written by `bench.py`) are grouped by workload tag; a figure
  never mixes workloads, and within a workload a series is one run, named by every tag that tells
  it apart from the others (engine label, dtype, mode, method, checkpoint, transport, and the sweep
  when two sweeps are otherwise identical: `load.plots.series_labels`).
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
from workbench.load.matrix import COLUMNS as MATRIX_COLUMNS
from workbench.load.metrics import METRIC_NAMES
from workbench.report.perf import PerfRuns, collect_perf_runs
from workbench.report.studies import StudyRuns, collect_study_runs

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
    studies: StudyRuns = field(default_factory=StudyRuns)  # personalization-study runs (`studies.py`)
    latest: bool = False  # only the most recent sweep / study run of each experiment was read
    perf: PerfRuns = field(default_factory=PerfRuns)  # `workbench microbench` runs (`perf.py`)


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


def _sweep_labels(runs) -> dict[str, str]:
    """Sweep run id -> a short name for it (its start time), the last resort that tells two series apart."""
    return {r.info.run_id: _dt.datetime.fromtimestamp(r.info.start_time / 1000).strftime("sweep %m-%d %H:%M:%S")
            for r in runs if r.data.tags.get(names.TAG_STAGE) == names.STAGE_LOAD_SWEEP}  # fmt: skip


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
    """Read every run of MLflow experiment(s) `experiment` into a Study (load summary, points, quality, join,
    and the personalization-study runs: `studies.collect_study_runs`).

    Several experiments can be read together, e.g. a load sweep and the quality study whose
    evaluation runs give the Pareto plots their quality axis. With `latest`, only the most recent
    sweep and study run of each experiment is read (re-running otherwise shows both runs side by
    side); the quality runs the join draws on are all kept.
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
    sweeps = _sweep_labels(runs)
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
            row["sweep"] = sweeps.get(t.get("mlflow.parentRunId", ""), "")
            summary.append(row)
            if r.info.status == "FINISHED":
                for p in _metric_history_points(client, r):
                    points.append({"run_id": r.info.run_id, "series": row["series"], "engine": row["engine"],
                                   "method": row["method"], "workload": row["workload"], **p})  # fmt: skip
        elif stage == names.STAGE_LOAD_SWEEP:
            parents.append({
                "name": t.get("mlflow.runName", ""), "run_id": r.info.run_id, "status": r.info.status,
                "commit": t.get(names.TAG_GIT_COMMIT, "unknown"), "slo_source": t.get(names.TAG_SLO_SOURCE, ""),
                "cpu": t.get(names.TAG_CPU, ""),
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
    def artifact(rid: str, path: str) -> dict | None:
        return _load_artifact_dict(client, rid, path)

    studies = collect_study_runs(client, runs, latest, artifact)
    return Study(", ".join(exp_names), uri, summary_df, points_df, quality_df, joined, not_joined,
                 sorted(parents, key=lambda p: p["start"]), studies, latest,
                 collect_perf_runs(runs, latest, artifact))  # fmt: skip


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
        "grid_held_qps": m.get(names.GRID_HELD, math.nan), "grid_broke_qps": m.get(names.GRID_BROKE, math.nan),
        "usd_per_1m": m.get(names.COST_PER_1M, math.inf), "relative_cost": m.get(names.COST_RELATIVE, math.nan),
        "relative_cost_method": m.get(names.COST_RELATIVE_METHOD, math.nan),
        "client_cpu_share_max": m.get("load/client_cpu_share_max", math.nan),
        "error": t.get(names.TAG_ERROR, ""),
        "features": t.get(names.TAG_FEATURES, ""),
        **{col: m.get(key, math.nan) for key, col in MATRIX_COLUMNS.items()},
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
    label = keyed(summary)["series"]  # the note names the run as the figures do (engine · dtype · ...)
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
            notes.append(f"{label[i]} / {row['method']} / {row['workload']}: not joined ({why})")
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
    """The report's figures by title: the study's, the method x engine matrix's, per workload
    latency/throughput/cost, the Pareto plots, then the performance runs'."""
    from workbench.load.matrix import matrix_figures
    from workbench.report import perf, studies

    matrix = matrix_figures(matrix_of(study)) if has_matrix(study) else {}
    return {**studies.figures(study.studies), **matrix, **load_figures(study), **join_figures(study, quality_metric),
            **perf.figures(study.perf)}


def has_matrix(study: Study) -> bool:
    """Whether a load sweep here ranked a quality sample per cell (`load.quality_users`)."""
    s = study.summary
    return len(s) > 0 and "quality_users" in s and bool(s["quality_users"].notna().any())


def load_figures(study: Study) -> dict[str, Any]:
    """Per workload: latency vs achieved QPS, achieved vs offered, $ per 1M; one series per run."""
    from workbench.load import plots

    figs: dict[str, Any] = {}
    s = study.summary
    if len(s) == 0:
        return figs
    fin = s[s["status"] == "FINISHED"]
    for wl, g in fin.groupby("workload", sort=False):
        g = keyed(g)
        pts = study.points[study.points["workload"] == wl] if len(study.points) else study.points
        slo = float(g["slo_ms"].dropna().iloc[0]) if g["slo_ms"].notna().any() else None
        if len(pts):
            pts = pts.assign(series=pts["run_id"].map(dict(zip(g["run_id"], g["series"]))))
            t1, t2 = f"{wl}: latency vs achieved QPS", f"{wl}: throughput vs offered rate"
            figs[t1] = plots.latency_vs_qps(pts, slo, title=t1)
            figs[t2] = plots.throughput_vs_offered(pts, title=f"{wl}: achieved vs offered")
        figs[f"{wl}: cost per 1M requests"] = plots.cost_bars(g, title=f"{wl}: $ per 1M requests")
    return figs


def join_figures(study: Study, quality_metric: str | None = None) -> dict[str, Any]:
    """Quality vs $ per 1M requests and vs p99 latency (the quality-vs-cost front), where quality joined."""
    quality_metric = quality_metric or default_quality_metric()
    from workbench.load import plots

    j = study.joined
    if not (len(j) and quality_metric in j and j[quality_metric].notna().any()):
        return {}
    rate, p99 = common_rate_p99(study.points, j)
    jj = keyed(j[j[quality_metric].notna()])
    jj["e2e_p99_ms"] = jj["run_id"].map(p99)
    figs = {"quality vs cost": plots.quality_pareto(jj, quality_metric, "usd_per_1m", "USD per 1M requests")}
    if jj["e2e_p99_ms"].notna().any():  # no run's rate points reach the common rate: no p99 to compare there
        figs["quality vs p99 latency"] = plots.quality_pareto(jj, quality_metric, "e2e_p99_ms",
                                                              f"p99 latency at {rate:.3g} req/s (ms)")
    return figs


def _short_paths(paths: Sequence[str]) -> list[str]:
    """The part of each path that differs from the others: a checkpoint's own folder, not the long common path."""
    parts = [str(p).strip("/").split("/") if p else [""] for p in paths]
    if len(set(map(tuple, parts))) < 2:
        return [ps[-1] for ps in parts]
    lead = 0
    while all(len(ps) > lead + 1 for ps in parts) and len({ps[lead] for ps in parts}) == 1:
        lead += 1
    trail = 0
    while all(len(ps) > lead + trail + 1 for ps in parts) and len({ps[-1 - trail] for ps in parts}) == 1:
        trail += 1
    return ["/".join(ps[lead:len(ps) - trail]) for ps in parts]


def keyed(runs):
    """A copy of one-row-per-load-run `runs` whose `series` names each run by every tag that tells it apart."""
    from workbench.load import plots

    df = runs.copy()
    if len(df) and "checkpoint" in df:
        full = df["checkpoint"].tolist()
        df["checkpoint"] = _short_paths(df["checkpoint"].fillna("").astype(str).tolist())
        df["series"] = plots.series_labels(df)
        df["checkpoint"] = full
    elif len(df):
        df["series"] = plots.series_labels(df)
    return df


# ---- HTML ----------------------------------------------------------------------------------------------

# Tables scroll inside their own box (never widen the page); long ones also scroll down with the header kept.
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
.tbl{overflow-x:auto;width:fit-content;max-width:100%;margin:1em 0}.tbl.tall{max-height:34em;overflow-y:auto}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;
white-space:nowrap}th{background:#f3f3f3;position:sticky;top:0;white-space:normal;min-width:4em}
td:first-child,th:first-child{text-align:left}.kv td{white-space:normal;text-align:left;overflow-wrap:anywhere}
pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:12px;max-height:30em}
h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}.note{color:#555}.fig{max-width:100%;overflow:hidden}
nav ul{font-size:14px}code{overflow-wrap:anywhere}
"""

_SUMMARY_COLS = ["series", "method", "workload", "mode", "dtype", "transport", "unloaded_p50_ms", "slo_ms",
                 "saturation_qps", "grid_held_qps", "grid_broke_qps", "usd_per_1m", "relative_cost",
                 "relative_cost_method", "client_cpu_share_max", "status"]  # fmt: skip
_TALL = 15  # rows above which a table also scrolls vertically


def _table(df, cols=None, floatfmt="{:.4g}") -> str:
    if df is None or len(df) == 0:
        return "<p class='note'>(none)</p>"
    d = df[[c for c in (cols or df.columns) if c in df.columns]].copy()
    tall = " tall" if len(d) > _TALL else ""
    body = d.to_html(index=False, escape=True, na_rep="-", float_format=lambda x: floatfmt.format(x), border=0)
    return f"<div class='tbl{tall}'>{body}</div>"


def _kv(rows: list[tuple[str, str]]) -> str:
    """A two-column key/value table (run facts); values escaped."""
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows if v)
    return f"<div class='tbl'><table class='kv'>{cells}</table></div>"


def _details(title: str, obj) -> str:
    if not obj:
        return ""
    body = html.escape(json.dumps(obj, indent=2))
    return f"<details><summary>{html.escape(title)}</summary><pre>{body}</pre></details>"


class _Figures:
    """Renders figures in page order, embedding plotly.js once (with the first) so the file opens offline."""

    def __init__(self) -> None:
        self.first = True

    def __call__(self, figs: dict[str, Any]) -> str:
        import plotly.io as pio

        parts = []
        for title, fig in figs.items():
            parts.append(f"<h3>{html.escape(title)}</h3><div class='fig'>")
            parts.append(pio.to_html(fig, include_plotlyjs=self.first, full_html=False, default_height=480,
                                     config={"responsive": True, "displaylogo": False}))  # fmt: skip
            parts.append("</div>")
            self.first = False
        return "\n".join(parts)


def _study_html(study: Study, draw: _Figures) -> list[str]:
    from workbench.report import studies as st

    sr = study.studies
    figs = st.figures(sr)
    n = len(sr.runs)
    parts = ["<h2 id='study'>Personalization study</h2>",
             f"<p class='note'>{n} study run{'s' if n > 1 else ''}"
             + (" (the most recent of each experiment)" if study.latest else "")
             + ("; the tables tell them apart by the <code>study</code> column (<code>--latest</code> keeps the most "
                "recent)" if n > 1 and not study.latest else "") + ". Every number is a mean over seeds and test "
             "users with its seeds-then-users paired bootstrap 95% interval (seen items banned); a difference "
             "marked * has an interval that excludes 0.</p>"]  # fmt: skip
    if sr.table is None or len(sr.table) == 0:
        parts.append("<p class='note'>No comparison table: no study run here finished its evaluate stage.</p>")
    parts += ["<h3 id='study-quality'>Quality (vs none and the baselines)</h3>", _table(st.quality_rows(sr))]
    parts.append(draw({k: v for k, v in figs.items() if k == "study: test quality per method"}))
    parts.append("<h3 id='study-slices'>Quality by history length</h3>")
    sl = st.slice_rows(sr)
    parts.append("<p class='note'>The test users cut into quartiles of their train + valid interaction count (edges "
                 "over the test users, in the <code>history length</code> column); each quartile's intervals are "
                 "the seeds-then-users bootstrap on its users.</p>" + _table(sl) if len(sl) else
                 "<p class='note'>No table by history length: these runs did not log "
                 "<code>comparison_by_history.csv</code> (evaluated before it existed).</p>")
    parts.append(draw({k: v for k, v in figs.items() if k == "study: quality by history length"}))
    parts += ["<h3 id='study-seeds'>Per-seed values</h3>",
              "<p class='note'>One row per evaluation run (method x training seed x signal) and baseline run.</p>",
              _table(st.per_seed_rows(sr))]
    parts.append("<h3 id='study-curves'>Learning curves</h3>")
    parts.append(draw({k: v for k, v in figs.items() if "validation NDCG@10" in k})
                 or "<p class='note'>No train runs with per-epoch validation metrics.</p>")
    parts.append("<h3 id='study-ablation'>User-signal ablation (own vs shuffled vs zeroed)</h3>")
    abl = st.ablation_rows(sr)
    parts.append(_table(abl) if len(abl) else "<p class='note'>No ablation runs (evaluation.signal_ablation off).</p>")
    parts.append(draw({k: v for k, v in figs.items() if k == "study: what the user signal carries"}))
    parts += ["<h3 id='study-cost'>Prompt length and cost</h3>", _table(st.cost_rows(sr))]
    parts.append("<p class='note'>Quality against prompt length and against ms/request: one line per method across "
                 "the contexts the study ran it at (<code>methods.contexts</code>: <code>none-k5</code> is "
                 "<code>none</code> showing 5 history items), each point labelled with its items.</p>")
    parts.append(draw({k: v for k, v in figs.items()
                       if k in ("study: quality vs prompt length", "study: quality vs ms/request")}))
    parts += ["<h3 id='study-sids'>Semantic IDs: codebook statistics</h3>", _table(st.sid_table(sr))]
    parts.append(draw({k: v for k, v in figs.items() if k == "study: SID codebook utilization"}))
    parts.append("<h3 id='study-runs'>Study runs: config, commit, CPU, versions</h3>")
    for r in sr.runs:
        parts.append(f"<h4>{html.escape(r['label'])}</h4>")
        env = r.get("environment") or {}
        hw = env.get("hardware") or {}
        parts.append(_kv([
            ("run", f"{r['run_id']} ({r['status']}, started {r['start']}, {r['children']} child runs)"),
            ("experiment file", r["experiment_file"]), ("dataset", r["dataset"]), ("stages", r["stages"]),
            ("commit", r["commit"]), ("commits of child runs", ", ".join(r["child_commits"])),
            ("CPU", r["cpu"]),
            ("machine", ", ".join(f"{k} {v}" for k, v in hw.items() if k not in ("cpu_model", "cpu_flags"))),
            ("config hash", r["config_hash"]),
        ]))  # fmt: skip
        versions = env.get("versions") or {}
        if versions:
            parts.append(_table(_frame_of([{"package": k, "version": v} for k, v in versions.items()])))
        parts += [_details("config.json", r.get("config")), _details("environment.json", env),
                  _details("semantic_ids stage_config.json", r.get("sid_config")),
                  _details("stages.json (cache keys, hits, timings)", r.get("stages_json"))]
    return parts


def _frame_of(rows: list[dict]):
    import pandas as pd

    return pd.DataFrame(rows)


def _load_html(study: Study, draw: _Figures) -> list[str]:
    parts = ["<h2 id='load'>Load sweeps</h2>",
             "<p class='note'>Saturation QPS = the highest achieved rate whose p99 is inside the SLO with no failures; "
             "the rate grid resolves it only to the offered rates it ended between, grid_held_qps (the highest whose "
             "point held) and grid_broke_qps (the lowest above it that broke; empty: none), and an achieved rate also "
             "carries the arrivals' randomness, so two series differ decisively only where those brackets do not "
             "overlap; "
             "$ per 1M = hourly price / (saturation QPS x 3600) x 1e6. A series is one run, named by every tag that "
             "tells it apart from the others.</p>", "<h3 id='load-summary'>Summary</h3>",
             _table(keyed(study.summary), _SUMMARY_COLS)]  # fmt: skip
    failed = study.summary[study.summary["status"] != "FINISHED"] if len(study.summary) else study.summary
    if len(failed):
        cols = ["series", "method", "workload", "status", "error"]
        parts.append("<h3>Runs that did not finish</h3>" + _table(failed, cols))
    figs = load_figures(study)
    parts.append(draw(figs) if figs else "<p class='note'>No finished load runs in this experiment.</p>")
    parts.append("<h3 id='load-points'>Rate points</h3>")
    pts = study.points
    if len(pts):
        k = keyed(study.summary)
        pts = pts.assign(series=pts["run_id"].map(dict(zip(k["run_id"], k["series"]))))
    parts.append(_table(pts, ["series", "method", "workload", "step", "offered_qps", "achieved_qps",
                              "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms", "ttft_p50_ms", "failures",
                              "goodput_qps", "client_cpu_share", "loop_cpu_share"]))  # fmt: skip
    parts.append("<h3 id='load-sweeps'>Sweeps: config, versions, hardware, commit</h3>")
    for p in study.parents:
        parts.append(f"<h4>{html.escape(p['name'])} <small>({html.escape(p['start'])}, run {p['run_id']}, "
                     f"{html.escape(p['status'])})</small></h4>")  # fmt: skip
        cpu = f"; CPU {html.escape(p['cpu'])}" if p.get("cpu") else ""
        parts.append(f"<p>commit <code>{html.escape(p['commit'])}</code>{cpu}; SLO: {html.escape(p['slo_source'])}</p>")
        for key in ("environment", "config"):
            parts.append(_details(key, p.get(key)))
    return parts


def matrix_of(study: Study):
    """The method x engine table of the load runs that ranked a quality sample (`load.matrix.matrix_table`): a
    column per engine series (the engine's label), the newest run of each (method, series) where sweeps repeat."""
    from workbench.load.matrix import matrix_table

    s = study.summary
    return matrix_table(s[s["quality_users"].notna()].drop_duplicates(["method", "series"], keep="first"))


def _matrix_html(study: Study, draw: _Figures) -> list[str]:
    from workbench.load.matrix import matrix_figures

    table = matrix_of(study)
    parts = ["<h2 id='matrix'>Method x engine matrix</h2>",
             "<p class='note'>Each cell: one trained method's checkpoint on one engine. Quality: NDCG@10 of a fixed "
             "sample of test users ranked through that engine (95% users-bootstrap interval; one trained seed), and "
             "the share of those users whose top-10 list is identical to the torch engine's on the same checkpoint "
             "(the engine the study's quality comes from), and how many of the lists that differ are not a near-tie broken the "
             "other way (beams compared by the parity rule within the derived rounding bound). Cost: $ per 1M requests at the saturation QPS, or, where no "
             "offered rate held the SLO, at the engine's serial capacity (1 / unloaded p50), labelled. Features: how "
             "each feature the method needs ran on that engine (native / emulated / unsupported).</p>"]
    parts.append(draw(matrix_figures(table)))
    parts.append(_table(table, ["method", "series", "mode", "ndcg10", "ndcg10_lo", "ndcg10_hi", "recall10",
                                "agree_top10", "max_ndcg10_change", "beyond_bound", "max_logprob_diff",
                                "logprob_bound", "unloaded_p50_ms", "best_p99_ms",
                                "saturation_qps", "serial_qps", "usd_per_1m", "cost_basis", "features"]))
    return parts


def _join_html(study: Study, quality_metric: str, draw: _Figures) -> list[str]:
    parts = [f"<h2 id='join'>Quality vs cost ({html.escape(quality_metric)})</h2>",
             f"<p class='note'>Quality is joined to a load run only when {', '.join(JOIN_TAGS)} all match.</p>"]
    figs = join_figures(study, quality_metric)
    if figs:
        parts.append(draw(figs))
    elif not len(study.quality):
        parts.append("<p class='note'>No quality runs here: add the study's experiment, e.g. "
                     f"<code>workbench report --experiment STUDY,{html.escape(study.experiment)}</code>.</p>")
    if len(study.joined) and quality_metric in study.joined and study.joined[quality_metric].notna().any():
        parts.append(_table(keyed(study.joined[study.joined[quality_metric].notna()]),
                            ["series", "method", "mode", "dtype", quality_metric, "usd_per_1m",
                             "saturation_qps"]))  # fmt: skip
    if study.not_joined:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in study.not_joined) + "</ul>")
    return parts


def _perf_html(study: Study, draw: _Figures) -> list[str]:
    from workbench.report import perf

    p = study.perf
    n = len(p.runs)
    parts = ["<h2 id='perf'>Performance runs</h2>",
             f"<p class='note'>{n} run{'s' if n > 1 else ''} of <code>workbench microbench</code>, newest first"
             + (" (the most recent of each command line)" if study.latest else "") + "; one row per result it "
             "printed (<code>--dtype both</code>: one per dtype). <b>ms</b> / <b>vs ms</b> / <b>ratio</b>: "
             "side by side, torch vs hf ms per beam request and hf / torch; <code>--floor</code>, the median "
             "unloaded request vs its matmul floor and their paired ratio; <code>--ab</code>, B's vs A's median "
             "ms and the median per-request B / A. Each ran on the CPU and commit its row names; rates on "
             "different CPUs, thread counts or dtypes are not comparable.</p>",
             "<h3 id='perf-table'>Results</h3>", _table(p.table, perf.TABLE_COLUMNS)]  # fmt: skip
    figs = perf.figures(p)
    if figs:
        parts.append(draw(figs))
    parts.append("<h3 id='perf-runs'>Performance runs: arguments, versions, hardware</h3>")
    for r in p.runs:
        parts.append(f"<h4>{html.escape(r['label'])} <small>({html.escape(r['start'])}, run {r['run_id']}, "
                     f"{html.escape(r['status'])})</small></h4>")  # fmt: skip
        parts.append(_kv([("command", r["command"]), ("commit", r["commit"]), ("CPU", r["cpu"]),
                          ("error", r["error"])]))  # fmt: skip
        parts += [_details("arguments (config.json)", r.get("config")),
                  _details("environment.json", r.get("environment"))]
    return parts


def render_html(study: Study, quality_metric: str | None = None) -> str:
    """The page: a section per kind of run the experiment(s) hold (study, load sweeps, their join, perf runs)."""
    quality_metric = quality_metric or default_quality_metric()
    draw = _Figures()
    has_study, has_load, has_perf = bool(study.studies.runs), len(study.summary) > 0, bool(study.perf.runs)
    matrix = has_matrix(study)
    toc = ([("study", "Personalization study")] if has_study else []) + (
        [("matrix", "Method x engine matrix")] if matrix else []) + (
        [("load", "Load sweeps"), ("join", "Quality vs cost")] if has_load else []) + (
        [("perf", "Performance runs")] if has_perf else [])  # fmt: skip
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(study.experiment)}</title>",
             "<meta name='viewport' content='width=device-width, initial-scale=1'>",
             f"<style>{_CSS}</style></head><body>", f"<h1>Workbench report: {html.escape(study.experiment)}</h1>",
             f"<p class='note'>Generated {_dt.datetime.now().isoformat(timespec='seconds')} from MLflow store "
             f"<code>{html.escape(study.tracking_uri)}</code>: {len(study.studies.runs)} study run(s), "
             f"{len(study.parents)} load sweep(s) with {len(study.summary)} load run(s), {len(study.quality)} "
             "quality run(s)" + (f", {len(study.perf.runs)} performance run(s)" if has_perf else "")
             + ".</p>"]  # fmt: skip
    if toc:
        parts.append("<nav><ul>" + "".join(f"<li><a href='#{a}'>{html.escape(t)}</a></li>" for a, t in toc)
                     + "</ul></nav>")
    if has_study:
        parts += _study_html(study, draw)
    if matrix:
        parts += _matrix_html(study, draw)
    if has_load:
        parts += _load_html(study, draw)
        parts += _join_html(study, quality_metric, draw)
    if has_perf:
        parts += _perf_html(study, draw)
    if not (has_study or has_load or has_perf):
        parts.append("<p class='note'>No study runs (<code>workbench run</code>), no load runs "
                     "(<code>workbench bench</code>) and no performance runs (<code>workbench microbench</code>) "
                     "in this experiment.</p>")
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
