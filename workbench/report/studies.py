"""The personalization study's part of the report, read back from what `workbench run` logs.

A study run is a top-level MLflow run with one child run per stage (`study/pipeline.py`); what the
report shows comes from, and only from:

- the comparison table (`comparison_table.csv` on the parent, `study/compare.py`): means with
  seeds-then-users intervals, the paired differences vs none / als / ease / sasrec and vs the method's own
  signal, per-seed NDCG@10, prompt tokens, training FLOPs, ms/request, SID validity, best epoch and epochs run;
- the same table per quartile of the test users' history length (`comparison_by_history.csv`,
  `study/slices.py`), where the run logged it;
- the evaluation child runs (one per method x seed x signal, and the als / sasrec baselines): the
  per-seed values;
- the train child runs (one per method x seed x LR): validation NDCG@10 and cumulative training
  FLOPs per epoch, logged at the optimizer step that ended the epoch (the learning curves);
- the semantic_ids child run: codebook statistics (`sid/*`, `user_sid/*` metrics) and its config;
- the parent's tags (commit, `workbench.cpu`), `config.json`, `environment.json`, `stages.json`.

Nothing is recomputed: a number in the report is a number a run logged.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from typing import Any

from workbench import names
from workbench.names import BY_HISTORY, SAME_CONTEXT, SLICE, SLICE_USERS

N10, R10 = names.ndcg_at(10), names.recall_at(10)
ABLATED_SIGNALS = ("own", "shuffled", "zeroed")
REFERENCES = (("none", "vs none"), ("als", "vs ALS"), ("ease", "vs EASE"), ("sasrec", "vs SASRec"))
STUDY_STAGES = frozenset(names.STAGES)


@dataclass
class StudyRuns:
    """Every study run of the experiment(s), as DataFrames; `study` tells the runs apart in each."""

    runs: list[dict] = field(default_factory=list)  # one per study (parent) run: label, ids, commit, cpu, config, ...
    table: Any = None  # comparison_table.csv rows, with a `study` column
    slices: Any = None  # comparison_by_history.csv rows (a `slice` column), with a `study` column
    per_seed: Any = None  # one row per evaluation / baseline child run
    curves: Any = None  # one row per (train run, epoch)
    sid: Any = None  # one row per (study, statistic), one column per SID family
    sid_utilization: Any = None  # one row per (study, SID family, level)

    @property
    def multi(self) -> bool:
        return len(self.runs) > 1


def _frame(rows: list[dict]):
    import pandas as pd

    return pd.DataFrame(rows)


def _when(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M")


def is_study_parent(run, child_stages: set[str]) -> bool:
    """A top-level run of `workbench run`: it says which stages it ran, or has a stage child run."""
    t = run.data.tags
    if "mlflow.parentRunId" in t or t.get(names.TAG_STAGE) in (names.STAGE_LOAD, names.STAGE_LOAD_SWEEP):
        return False
    return names.TAG_STAGES in t or bool(child_stages & STUDY_STAGES)


def collect_study_runs(client, runs, latest: bool, load_artifact) -> StudyRuns:
    """The study runs among `runs` (all runs of the experiments read) and what their children logged.

    `latest` keeps the most recent study run of each experiment. `load_artifact(run_id, path)`
    returns a JSON artifact as a dict, or None (html.py's reader, shared with the load sweeps).
    """
    children: dict[str, list] = {}
    for r in runs:
        pid = r.data.tags.get("mlflow.parentRunId")
        if pid:
            children.setdefault(pid, []).append(r)
    parents = [r for r in runs if is_study_parent(r, {c.data.tags.get(names.TAG_STAGE, "")
                                                       for c in children.get(r.info.run_id, [])})]  # fmt: skip
    if latest:
        newest: dict[str, Any] = {}
        for r in parents:
            cur = newest.get(r.info.experiment_id)
            if cur is None or r.info.start_time > cur.info.start_time:
                newest[r.info.experiment_id] = r
        parents = list(newest.values())
    parents.sort(key=lambda r: r.info.start_time)
    out = StudyRuns()
    if not parents:
        return out
    labels = _study_labels(parents)
    tables, slices, seeds, curves, sid, util = [], [], [], [], [], []
    for p in parents:
        kids = children.get(p.info.run_id, [])
        label = labels[p.info.run_id]
        out.runs.append(_run_info(p, kids, label, load_artifact))
        table = _comparison_table(client, p, kids)
        if table is not None:
            table.insert(0, "study", label)
            tables.append(table)
        sliced = _comparison_table(client, p, kids, f"{BY_HISTORY}.csv")
        if sliced is not None:
            sliced.insert(0, "study", label)
            slices.append(sliced)
        seeds += [row for k in kids if (row := _per_seed_row(k, label)) is not None]
        for k in kids:
            if k.data.tags.get(names.TAG_STAGE) == "train":
                curves += _curve_rows(client, k, label)
            elif k.data.tags.get(names.TAG_STAGE) == "semantic_ids":
                s, u = _sid_rows(k, label)
                sid += s
                util += u
    import pandas as pd

    out.table = pd.concat(tables, ignore_index=True) if tables else _frame([])
    out.slices = pd.concat(slices, ignore_index=True) if slices else _frame([])
    out.per_seed = _frame(seeds)
    if len(out.per_seed):
        out.per_seed = out.per_seed.sort_values(["study", "method", "seed"], kind="stable").reset_index(drop=True)
    out.curves = _frame(curves)
    out.sid = _frame(sid)
    out.sid_utilization = _frame(util)
    return out


def _study_labels(parents) -> dict[str, str]:
    """The run name; with the start time when two kept study runs share a name (a re-run)."""
    from collections import Counter

    n = Counter(p.data.tags.get("mlflow.runName", "study") for p in parents)
    out = {}
    for p in parents:
        name = p.data.tags.get("mlflow.runName", "study")
        out[p.info.run_id] = f"{name} {_when(p.info.start_time)}" if n[name] > 1 else name
    return out


def _cpu(tags: dict, kids, env: dict | None) -> str:
    """The `workbench.cpu` tag (every run has it since it was added), else what environment.json says."""
    if tags.get(names.TAG_CPU):
        return tags[names.TAG_CPU]
    for k in kids:
        if k.data.tags.get(names.TAG_CPU):
            return k.data.tags[names.TAG_CPU]
    hw = (env or {}).get("hardware") or {}
    if hw.get("cpu_model"):
        flags = hw.get("cpu_flags")
        flags = "instruction sets not logged" if flags is None else (flags or "no AVX-512")
        return f"{hw['cpu_model']} ({flags}; from environment.json: this run has no {names.TAG_CPU} tag)"
    return "unknown"


def _run_info(p, kids, label: str, load_artifact) -> dict:
    t = p.data.tags
    env = load_artifact(p.info.run_id, "environment.json")
    commit = t.get(names.TAG_GIT_COMMIT, "unknown")
    others = sorted({k.data.tags.get(names.TAG_GIT_COMMIT) for k in kids} - {commit, None})
    sid_cfg = None
    for k in kids:
        if k.data.tags.get(names.TAG_STAGE) == "semantic_ids":
            sid_cfg = load_artifact(k.info.run_id, "stage_config.json")
    return {
        "label": label, "name": t.get("mlflow.runName", ""), "run_id": p.info.run_id, "status": p.info.status,
        "experiment_id": p.info.experiment_id, "start": _dt.datetime.fromtimestamp(p.info.start_time / 1000)
        .isoformat(timespec="seconds"), "stages": t.get(names.TAG_STAGES, ""), "dataset": t.get(names.TAG_DATASET, ""),
        "experiment_file": t.get(names.TAG_EXPERIMENT_FILE, ""), "config_hash": t.get(names.TAG_CONFIG_HASH, ""),
        "commit": commit, "child_commits": others, "cpu": _cpu(t, kids, env),
        "config": load_artifact(p.info.run_id, "config.json"), "environment": env,
        "stages_json": load_artifact(p.info.run_id, "stages.json"), "sid_config": sid_cfg,
        "children": len(kids),
    }  # fmt: skip


def _comparison_table(client, parent, kids, artifact: str = "comparison_table.csv"):
    """`artifact` of the parent (log_study), else of the evaluate stage's run; None before evaluate (or, for the
    table by history length, in a run from before it was logged)."""
    import tempfile

    import pandas as pd

    evals = [k for k in kids if k.data.tags.get(names.TAG_STAGE) == "evaluate" and names.TAG_METHOD not in k.data.tags]
    for rid in [parent.info.run_id] + [k.info.run_id for k in evals]:
        try:
            with tempfile.TemporaryDirectory() as d:
                return pd.read_csv(client.download_artifacts(rid, artifact, d))
        except Exception:  # noqa: BLE001 - no evaluate stage (yet) in this run
            continue
    return None


def _per_seed_row(k, label: str) -> dict | None:
    """One evaluated (method, seed, signal) or baseline run; None for anything else."""
    t, m = k.data.tags, k.data.metrics
    if (names.TAG_METHOD not in t or t.get(names.TAG_STAGE) == "train" or not any(x.startswith("quality/") for x in m)
            or k.info.status != "FINISHED"):  # fmt: skip
        return None
    signal = t.get(names.TAG_SIGNAL, "own")
    method = t[names.TAG_METHOD] if signal == "own" else f"{t[names.TAG_METHOD]}/{signal}"
    nan = math.nan
    return {
        "study": label, "method": method, "signal": signal, "seed": t.get(names.TAG_SEED, "-"),
        N10: m.get(N10, nan), R10: m.get(R10, nan), names.MRR: m.get(names.MRR, nan),
        names.COVERAGE: m.get(names.COVERAGE, nan), names.PROMPT_TOKENS_MEAN: m.get(names.PROMPT_TOKENS_MEAN, nan),
        names.PROMPT_TOKENS_P95: m.get(names.PROMPT_TOKENS_P95, nan), names.TRAIN_FLOPS: m.get(names.TRAIN_FLOPS, nan),
        "train/wall_s": m.get("train/wall_s", nan), "latency/request_mean_ms": m.get("latency/request_mean_ms", nan),
        names.SID_VALIDITY: m.get(names.SID_VALIDITY, nan),
        names.BEST_VALID_NDCG10: m.get(names.BEST_VALID_NDCG10, nan), names.BEST_EPOCH: m.get(names.BEST_EPOCH, nan),
        "lr": m.get("lr", nan), "run_id": k.info.run_id,
    }  # fmt: skip


def _curve_rows(client, k, label: str) -> list[dict]:
    """Validation NDCG@10 and cumulative training FLOPs at the end of each epoch of one train run."""
    t = k.data.tags

    def history(key: str) -> dict[int, float]:
        if key not in k.data.metrics:
            return {}
        return {m.step: m.value for m in sorted(client.get_metric_history(k.info.run_id, key),
                                                 key=lambda m: (m.step, m.timestamp))}  # fmt: skip

    ndcg, flops, loss = history(names.VALID_NDCG10), history(names.TRAIN_FLOPS), history(names.TRAIN_EPOCH_LOSS)
    return [{"study": label, "method": t.get(names.TAG_METHOD, "?"), "seed": t.get(names.TAG_SEED, "-"),
             "lr": t.get(names.TAG_LR, "-"), "epoch": i, "step": step, names.VALID_NDCG10: ndcg[step],
             names.TRAIN_FLOPS: flops.get(step, math.nan), names.TRAIN_EPOCH_LOSS: loss.get(step, math.nan),
             "run_id": k.info.run_id}
            for i, step in enumerate(sorted(ndcg), 1)]  # fmt: skip


def _sid_families(metrics: dict, kind: str | None) -> dict[str, str]:
    """metric prefix -> display name: the item SIDs, the user SIDs, and item SIDs of another kind (also_fit)."""
    fams = {"sid": f"item SIDs ({kind})" if kind else "item SIDs", "user_sid": "user SIDs"}
    for key in metrics:
        pre = key.split("/")[0]
        if pre.startswith("sid_") and pre[4:] != kind:
            fams[pre] = f"item SIDs ({pre[4:]}, also fit)"
    return {p: n for p, n in fams.items() if any(k.startswith(p + "/") for k in metrics)}


def _sid_rows(k, label: str) -> tuple[list[dict], list[dict]]:
    m, kind = k.data.metrics, k.data.tags.get(names.TAG_SID_KIND)
    fams = _sid_families(m, kind)
    stats = sorted({key.split("/", 1)[1] for key in m if key.split("/")[0] in fams})
    rows = [{"study": label, "statistic": s, **{n: m.get(f"{p}/{s}", math.nan) for p, n in fams.items()}}
            for s in stats]  # fmt: skip
    util = [{"study": label, "family": n, "level": int(s[len("utilization_l"):]), "utilization": m[f"{p}/{s}"]}
            for p, n in fams.items() for s in stats if s.startswith("utilization_l") and f"{p}/{s}" in m]  # fmt: skip
    return rows, util


# ---- tables -------------------------------------------------------------------------------------


def _isnum(x) -> bool:
    return isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x))


def _ci(row, key: str, signed: bool) -> str:
    """mean [lo, hi]; a difference whose interval excludes 0 is marked '*'."""
    x, lo, hi = row.get(key), row.get(key + "_lo"), row.get(key + "_hi")
    if not _isnum(x):
        return "-"
    f = "{:+.4f}" if signed else "{:.4f}"
    if not (_isnum(lo) and _isnum(hi)):
        return f.format(x)
    mark = " *" if signed and (lo > 0 or hi < 0) else ""
    return f"{f.format(x)} [{f.format(lo)}, {f.format(hi)}]{mark}"


def _fmt(x, spec: str) -> str:
    return spec.format(x) if _isnum(x) else "-"


def _seeds(row) -> str:
    """The per-seed NDCG@10 cell ("0.0812 0.0790 ..."); one seed's reads back from the CSV as a number."""
    x = row.get("per_seed/" + N10)
    return x if isinstance(x, str) else _fmt(x, "{:.4f}")


def quality_rows(sr: StudyRuns):
    """The quality table: every method and baseline on its own signal, intervals vs none and the baselines."""
    t = sr.table
    if t is None or len(t) == 0:
        return _frame([])
    rows = []
    for _, r in t[~t["method"].astype(str).str.contains("/")].iterrows():
        r = r.to_dict()
        row = {"study": r["study"]} if sr.multi else {}
        row.update({"method": r["method"], "seeds": _fmt(r.get("seeds"), "{:.0f}"),
                    "test users": _fmt(r.get("test_users"), "{:.0f}"), "NDCG@10 [95% CI]": _ci(r, N10, False),
                    "Recall@10 [95% CI]": _ci(r, R10, False), "MRR [95% CI]": _ci(r, names.MRR, False),
                    "NDCG@10 per seed": _seeds(r)})
        for ref, title in REFERENCES:
            row[f"ΔNDCG@10 {title}"] = _ci(r, f"vs_{ref}/{N10}", True)
        row["ΔNDCG@10 vs none at its context"] = _same_context(r)
        rows.append(row)
    return _frame(rows)


def _same_context(row) -> str:
    """The difference vs `none` at the row's context and that row's name (`compare.SAME_CONTEXT`); "-" without one."""
    ref = row.get(SAME_CONTEXT)
    if not isinstance(ref, str) or not ref:
        return "-"
    return f"{_ci(row, f'vs_{SAME_CONTEXT}/{N10}', True)} vs {ref}"


def slice_rows(sr: StudyRuns):
    """Quality by history length: each method and baseline (own signal) on each quartile's users, the quartiles of
    one method side by side; intervals are the seeds-then-users bootstrap on the quartile's users."""
    t = sr.slices
    if t is None or len(t) == 0:
        return _frame([])
    t = t[~t["method"].astype(str).str.contains("/")]
    rows = []
    for _, r in t.iterrows():
        r = r.to_dict()
        row = {"study": r["study"]} if sr.multi else {}
        row.update({"method": r["method"], "history length": r[SLICE], "users": _fmt(r.get(SLICE_USERS), "{:.0f}"),
                    "NDCG@10 [95% CI]": _ci(r, N10, False), "Recall@10 [95% CI]": _ci(r, R10, False)})
        for ref, title in REFERENCES:
            row[f"ΔNDCG@10 {title}"] = _ci(r, f"vs_{ref}/{N10}", True)
        rows.append(row)
    df = _frame(rows)
    order = {m: i for i, m in enumerate(dict.fromkeys(df["method"]))}  # the comparison table's order
    keys = (["study"] if sr.multi else []) + ["_o"]
    return df.assign(_o=df["method"].map(order)).sort_values(keys, kind="stable").drop(columns="_o")


def ablation_rows(sr: StudyRuns):
    """The user-signal ablation: each ablated method on its own, a shuffled and a zeroed signal."""
    t = sr.table
    if t is None or len(t) == 0:
        return _frame([])
    meth = t["method"].astype(str)
    variants = t[meth.str.contains("/")]
    base = set(variants["method"].str.split("/").str[0])
    rows = []
    for _, r in t[meth.isin(base) | meth.str.contains("/")].iterrows():
        r = r.to_dict()
        m, _, signal = str(r["method"]).partition("/")
        row = {"study": r["study"]} if sr.multi else {}
        row.update({"method": m, "signal": signal or "own", "NDCG@10 [95% CI]": _ci(r, N10, False),
                    "Recall@10 [95% CI]": _ci(r, R10, False), "ΔNDCG@10 vs own signal": _ci(r, f"vs_own/{N10}", True),
                    "ΔNDCG@10 vs none": _ci(r, f"vs_none/{N10}", True),
                    "NDCG@10 per seed": _seeds(r)})
        rows.append(row)
    if not rows:  # no method with a user signal (a study of `none` alone): no ablation table, not a KeyError
        return _frame([])
    df = _frame(rows)
    order = {s: i for i, s in enumerate(ABLATED_SIGNALS)}
    keys = (["study"] if sr.multi else []) + ["method", "_o"]
    return df.assign(_o=df["signal"].map(order)).sort_values(keys, kind="stable").drop(columns="_o")


def _epochs(row) -> str:
    """The epoch a trained row kept and the epochs it ran (means over seeds); "-" for a row that trained nothing or
    a run from before they were logged."""
    best, ran = row.get(names.BEST_EPOCH), row.get(names.EPOCHS_RUN)
    return f"{best:.1f} / {ran:.1f}" if _isnum(best) and _isnum(ran) else "-"


def cost_rows(sr: StudyRuns):
    """Prompt length and cost per method: what each method's quality costs to train and to serve."""
    t = sr.table
    if t is None or len(t) == 0:
        return _frame([])
    ps = sr.per_seed if sr.per_seed is not None and len(sr.per_seed) else None
    rows = []
    for _, r in t[~t["method"].astype(str).str.contains("/")].iterrows():
        r = r.to_dict()
        mine = ps[(ps["study"] == r["study"]) & (ps["method"] == r["method"])] if ps is not None else None

        def seed_mean(col: str) -> float:
            return float(mine[col].mean()) if mine is not None and len(mine) and mine[col].notna().any() else math.nan

        row = {"study": r["study"]} if sr.multi else {}
        row.update({"method": r["method"], "NDCG@10": _fmt(r.get(N10), "{:.4f}"),
                    "prompt tokens (mean)": _fmt(r.get(names.PROMPT_TOKENS_MEAN), "{:.1f}"),
                    "prompt tokens (p95)": _fmt(seed_mean(names.PROMPT_TOKENS_P95), "{:.0f}"),
                    "train FLOPs": _fmt(r.get(names.TRAIN_FLOPS), "{:.3g}"),
                    "train wall s": _fmt(seed_mean("train/wall_s"), "{:.0f}"),
                    "ms/request": _fmt(r.get("latency/request_mean_ms"), "{:.1f}"),
                    "SID validity": _fmt(r.get(names.SID_VALIDITY), "{:.3f}"),
                    "best epoch / run": _epochs(r)})
        rows.append(row)
    return _frame(rows)


PER_SEED_COLUMNS = {"study": "study", "method": "method", "seed": "seed", N10: "NDCG@10", R10: "Recall@10",
                    names.MRR: "MRR", names.COVERAGE: "coverage", names.PROMPT_TOKENS_MEAN: "prompt tokens",
                    names.TRAIN_FLOPS: "train FLOPs", "latency/request_mean_ms": "ms/request",
                    names.SID_VALIDITY: "SID validity", names.BEST_VALID_NDCG10: "best valid NDCG@10",
                    names.BEST_EPOCH: "best epoch", "lr": "lr"}


def per_seed_rows(sr: StudyRuns):
    """One row per evaluation run: the values each seed's intervals are built from."""
    ps = sr.per_seed
    if ps is None or len(ps) == 0:
        return _frame([])
    cols = [c for c in PER_SEED_COLUMNS if c in ps.columns and (c != "study" or sr.multi)]
    return ps[cols].rename(columns=PER_SEED_COLUMNS)


def sid_table(sr: StudyRuns):
    """Statistics down, SID families across (one column block per study when there are several)."""
    s = sr.sid
    if s is None or len(s) == 0:
        return _frame([])
    if not sr.multi:
        return s.drop(columns="study").dropna(axis=1, how="all")
    return s.pivot(index="statistic", columns="study").reset_index().pipe(_flat_columns)


def _flat_columns(df):
    df.columns = [" · ".join(str(x) for x in reversed(c) if x) if isinstance(c, tuple) else c for c in df.columns]
    return df.dropna(axis=1, how="all")


# ---- figures ------------------------------------------------------------------------------------


def figures(sr: StudyRuns) -> dict[str, Any]:
    """The study's figures by title; a figure whose data the runs did not log is left out."""
    figs: dict[str, Any] = {}
    t = sr.table
    if t is not None and len(t):
        figs["study: test quality per method"] = quality_figure(sr)
        abl = ablation_figure(sr)
        if abl is not None:
            figs["study: what the user signal carries"] = abl
        for x, title in ((names.PROMPT_TOKENS_MEAN, "study: quality vs prompt length"),
                         ("latency/request_mean_ms", "study: quality vs ms/request")):
            fig = context_figure(sr, x)
            if fig is not None:
                figs[title] = fig
    if sr.slices is not None and len(sr.slices):
        figs["study: quality by history length"] = slice_figure(sr)
    if sr.curves is not None and len(sr.curves):
        figs["study: validation NDCG@10 per epoch"] = curve_figure(sr, "epoch", "epoch", log_x=False)
        if sr.curves[names.TRAIN_FLOPS].notna().any():
            figs["study: validation NDCG@10 vs training FLOPs"] = curve_figure(sr, names.TRAIN_FLOPS,
                                                                                "training FLOPs (cumulative)", True)
    if sr.sid_utilization is not None and len(sr.sid_utilization):
        figs["study: SID codebook utilization"] = sid_figure(sr)
    return figs


def quality_figure(sr: StudyRuns):
    """NDCG@10 per method with its 95% interval (bars), each seed's value on top (dots)."""
    import plotly.graph_objects as go

    from workbench.load.plots import _PALETTE
    from workbench.study.outputs import error_bars

    t = sr.table[~sr.table["method"].astype(str).str.contains("/")]
    ps = sr.per_seed if sr.per_seed is not None else _frame([])
    fig = go.Figure()
    for i, (study, g) in enumerate(t.groupby("study", sort=False)):
        color = _PALETTE[i % len(_PALETTE)]
        name = f"{study}: " if sr.multi else ""
        fig.add_bar(x=g["method"], y=g[N10], name=f"{name}NDCG@10 (95% CI)", marker_color=color, opacity=0.75,
                    error_y=error_bars(g, N10), offsetgroup=study, legendgroup=study)  # fmt: skip
        if len(ps):
            s = ps[(ps["study"] == study) & (ps["signal"] == "own") & ps[N10].notna()]
            if len(s):
                fig.add_scatter(x=s["method"], y=s[N10], mode="markers", name=f"{name}per seed", offsetgroup=study,
                                legendgroup=study, marker=dict(color="black", size=7, symbol="circle-open"),
                                text=[f"seed {x}" for x in s["seed"]],
                                hovertemplate="%{x} %{text}: %{y:.4f}<extra></extra>")  # fmt: skip
    fig.update_layout(title="Test NDCG@10 per method: 95% CI over seeds and users (bars), each seed (dots)",
                      barmode="group", scattermode="group", yaxis_title="NDCG@10", template="plotly_white")
    return fig


def slice_figure(sr: StudyRuns):
    """NDCG@10 per method (own signal) on each quartile of history length and its difference vs `none`, with 95%
    intervals (`study.summary.history_figure`, the figure the study logs; one group per study and quartile)."""
    from workbench.study.outputs import history_figure

    return history_figure(sr.slices, by="study" if sr.multi else None)


def ablation_figure(sr: StudyRuns):
    """Own vs shuffled vs zeroed user signal, per ablated method."""
    import plotly.graph_objects as go

    from workbench.study.outputs import error_bars

    t = sr.table
    meth = t["method"].astype(str)
    if not meth.str.contains("/").any():
        return None
    base = set(meth[meth.str.contains("/")].str.split("/").str[0])
    df = t[meth.isin(base) | meth.str.contains("/")].copy()
    df["base"] = df["method"].astype(str).str.split("/").str[0]
    df["signal"] = df["method"].astype(str).map(lambda m: m.partition("/")[2] or "own")
    if sr.multi:
        df["base"] = df["study"] + " · " + df["base"]
    fig = go.Figure()
    for signal in ABLATED_SIGNALS:
        g = df[df["signal"] == signal]
        if len(g):
            fig.add_bar(x=g["base"], y=g[N10], name=f"{signal} signal", error_y=error_bars(g, N10))
    fig.update_layout(title="What the user signal carries: NDCG@10 with the own, a shuffled and a zeroed signal",
                      barmode="group", yaxis_title="NDCG@10 (95% CI)", template="plotly_white")
    return fig


def context_figure(sr: StudyRuns, x: str):
    """NDCG@10 against mean prompt tokens or ms/request: one line per method family across its contexts
    (`study.summary.context_figure`, the figure the study logs; one set of lines per study); None without `x`."""
    from workbench.study.outputs import context_figure as lines

    return lines(sr.table, x, by="study" if sr.multi else None)


def curve_figure(sr: StudyRuns, x: str, x_title: str, log_x: bool):
    """Validation NDCG@10 of every train run (method x seed x LR) against `x`, one color per method."""
    import plotly.graph_objects as go

    from workbench.load.plots import _PALETTE, series_labels

    c = sr.curves.copy()
    runs = c.drop_duplicates("run_id")
    named = runs.assign(seed="seed " + runs["seed"].astype(str), lr="lr " + runs["lr"].astype(str))
    label = dict(zip(runs["run_id"], series_labels(named, ("method", "seed", "lr", "study"))))
    colors = {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(dict.fromkeys(runs["method"]))}
    dashes = {s: d for s, d in zip(dict.fromkeys(runs["seed"]), ("solid", "dash", "dot", "dashdot", "longdash") * 9)}
    fig = go.Figure()
    for rid, g in c.groupby("run_id", sort=False):
        g = g[g[x].notna()].sort_values(x)  # joined along the x axis
        if len(g) == 0:
            continue
        m = g["method"].iloc[0]
        fig.add_scatter(x=g[x], y=g[names.VALID_NDCG10], mode="lines+markers", name=label[rid], legendgroup=m,
                        line=dict(color=colors.get(m), dash=dashes.get(g["seed"].iloc[0], "solid")),
                        customdata=g[["epoch"]].to_numpy(),
                        hovertemplate=f"{label[rid]}: %{{y:.4f}} after epoch %{{customdata[0]}}<extra></extra>")
    what = "per epoch" if x == "epoch" else "against training compute (the compute-matched view)"
    fig.update_layout(title=f"Validation NDCG@10 {what}", xaxis_title=x_title, yaxis_title="valid NDCG@10",
                      xaxis_type="log" if log_x else "linear", template="plotly_white")  # fmt: skip
    if x == "epoch":
        fig.update_xaxes(dtick=1)
    return fig


def sid_figure(sr: StudyRuns):
    """Share of each codebook's codes in use, per level, item and user SIDs."""
    import plotly.graph_objects as go

    u = sr.sid_utilization.copy()
    u["series"] = (u["study"] + " · " + u["family"]) if sr.multi else u["family"]
    fig = go.Figure()
    for s, g in u.groupby("series", sort=False):
        g = g.sort_values("level")
        fig.add_bar(x=[f"level {lv}" for lv in g["level"]], y=g["utilization"], name=str(s))
    fig.update_layout(title="SID codebook utilization: share of each level's codes used", barmode="group",
                      yaxis_title="codes used / codebook size", yaxis_range=[0, 1.05], template="plotly_white")
    return fig
