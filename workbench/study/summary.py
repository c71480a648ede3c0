"""The study's comparison table and figures, from the rows `compare.comparison_table` builds.

Separate from compare.py (which computes the rows) so notebooks and reports can format a table
they read back without importing the training and evaluation code. Every number in the table is a
mean over seeds and test users with its seeds-then-users bootstrap interval (`intervals.py`).
"""

from __future__ import annotations

import math

from workbench import names
from workbench.study import methods
from workbench.names import SAME_CONTEXT

N10, R10 = names.ndcg_at(10), names.recall_at(10)
LABELS = {"popularity": "popularity (baseline)", "als": "ALS (baseline)", "ease": "EASE (baseline)",
          "sasrec": "SASRec (baseline)"}


def _ci(row, key: str, digits: int = 4) -> str:
    x = row.get(key, float("nan"))
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:+.{digits}f} [{row[key + '_lo']:+.{digits}f}, {row[key + '_hi']:+.{digits}f}]"


def _mean_ci(row, key: str) -> str:
    return f"{row[key]:.4f} [{row[key + '_lo']:.4f}, {row[key + '_hi']:.4f}]"


def _num(row, key: str, fmt: str) -> str:
    x = row.get(key, float("nan"))
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _epochs(row) -> str:
    """The best epoch and the epochs run, means over seeds ("4.3 / 6.0"); "-" where the row trained nothing."""
    best, ran = _num(row, names.BEST_EPOCH, "{:.1f}"), _num(row, names.EPOCHS_RUN, "{:.1f}")
    return "-" if best == "-" else f"{best} / {ran}"


def _ref(row) -> str | None:
    """The `none` row at the row's context (`compare.SAME_CONTEXT`), or None (also when read back from a CSV: NaN)."""
    ref = row.get(SAME_CONTEXT)
    return ref if isinstance(ref, str) and ref else None


def _same_context(row) -> str:
    """The difference vs `none` at the same context, with that row's name: "+0.0100 [+0.0010, +0.0190] vs none-k5"."""
    ref = _ref(row)
    return "-" if ref is None else f"{_ci(row, f'vs_{SAME_CONTEXT}/{N10}')} vs {ref}"


def markdown_table(table) -> str:
    """The comparison as a markdown table (README-ready)."""
    cols = ["method", "seeds", "N@10 [95% CI]", "R@10", "MRR", "N@10 per seed", "vs none", "vs none at its context",
            "vs ALS", "vs EASE", "vs SASRec", "vs own signal", "prompt tokens", "train FLOPs", "ms/request",
            "best epoch / run"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.iterrows():
        r = r.to_dict()
        cells = [LABELS.get(r["method"], r["method"]), str(int(r["seeds"])), _mean_ci(r, N10), f"{r[R10]:.4f}",
                 f"{r[names.MRR]:.4f}", r.get("per_seed/" + N10, ""), _ci(r, f"vs_none/{N10}"), _same_context(r),
                 _ci(r, f"vs_als/{N10}"), _ci(r, f"vs_ease/{N10}"), _ci(r, f"vs_sasrec/{N10}"), _ci(r, f"vs_own/{N10}"),
                 _num(r, names.PROMPT_TOKENS_MEAN, "{:.0f}"), _num(r, names.TRAIN_FLOPS, "{:.2e}"),
                 _num(r, "latency/request_mean_ms", "{:.1f}"), _epochs(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdicts(table) -> list[str]:
    """Each comparison of the table in words: which side its 95% interval puts ahead, or that it decides
    nothing (the interval holds 0: the difference is inside seed and user noise). A variant row
    (`method/shuffled`, `method/zeroed`) is read against its method's own signal, a row with a `none` at its
    context (`none-k5` for `soft_token-k5`) against that one too; a pair the table holds twice (ALS vs SASRec and
    SASRec vs ALS; soft_token vs none and vs none at its context, where that is `none` itself) is said once."""
    out, said = [], set()
    for _, r in table.iterrows():
        r = r.to_dict()
        name = r["method"]
        for tag in ("own", "none", SAME_CONTEXT, "als", "ease", "sasrec"):
            key = f"vs_{tag}/{N10}"
            d = r.get(key)
            other = name.split("/")[0] if tag == "own" else _ref(r) if tag == SAME_CONTEXT else tag
            pair = frozenset((name, other))
            if d is None or (isinstance(d, float) and math.isnan(d)) or pair in said:
                continue
            said.add(pair)
            ref = (f"{name.split('/')[0]} with its own signal" if tag == "own" else f"{other} (the same context)"
                   if tag == SAME_CONTEXT else LABELS.get(tag, tag).removesuffix(" (baseline)"))  # ALS, SASRec
            lo, hi = r[key + "_lo"], r[key + "_hi"]
            if lo > 0:
                word = f"{name} is ahead"
            elif hi < 0:
                word = f"{name} is behind"
            else:
                word = "undecided (the interval holds 0)"
            out.append(f"{name} vs {ref}: NDCG@10 {d:+.4f} [{lo:+.4f}, {hi:+.4f}]: {word}")
    return out


def format_table(table, cfg) -> str:
    """The table as text for the console, with what it was measured on."""
    n_users = int(table["test_users"].iloc[0])
    seeds = ", ".join(str(s) for s in cfg.training.seeds)
    notes = [f"{cfg.name}: {cfg.dataset.name}, backbone {cfg.model.backbone}, {n_users} test users, seeds {seeds}, "
             f"beam {cfg.evaluation.beam_width}, seen items banned. Intervals: seeds-then-users paired bootstrap "
             f"({cfg.evaluation.bootstrap} resamples), NDCG@10 differences."]
    if cfg.name.startswith("quickstart"):
        notes.append("SMOKE-QUALITY numbers: small model, short training. Use the ml1m experiment for findings.")
    found = verdicts(table)
    said = ["What the intervals decide:", *(f"- {v}" for v in found)] if found else []
    return "\n".join(["", markdown_table(table), "", *notes, "", *said, ""])


def slices_markdown(by_history) -> str:
    """The comparison table of each history-length quartile (`slices.sliced_table`), one markdown table each."""
    out = ["Quality by history length: quartiles of the test users' train + valid interaction counts (edges over "
           "the test users); intervals: the seeds-then-users bootstrap on each quartile's users.", ""]
    for label, g in by_history.groupby(names.SLICE, sort=False):
        out += [f"### {label}: {int(g[names.SLICE_USERS].iloc[0])} test users", "", markdown_table(g), ""]
    return "\n".join(out)


def format_slices(by_history) -> str:
    """The console's short view of the slices: NDCG@10 and the difference vs none per method and quartile."""
    labels = list(dict.fromkeys(by_history[names.SLICE]))
    rows = by_history[~by_history["method"].astype(str).str.contains("/")]
    users = {lab: int(g[names.SLICE_USERS].iloc[0]) for lab, g in by_history.groupby(names.SLICE, sort=False)}
    cols = ["method", *(f"{lab}, {users[lab]} users" for lab in labels)]
    lines = ["NDCG@10 [95% CI] by history length (train + valid interactions); below it, the difference vs none:",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for key, fmt in ((N10, _mean_ci), (f"vs_none/{N10}", _ci)):
        for method in dict.fromkeys(rows["method"]):
            cells = [rows[(rows["method"] == method) & (rows[names.SLICE] == lab)] for lab in labels]
            vals = [fmt(c.iloc[0].to_dict(), key) if len(c) and key in c else "-" for c in cells]
            if any(v != "-" for v in vals):
                name = LABELS.get(method, method) + ("" if key == N10 else " - none")
                lines.append("| " + " | ".join([name, *vals]) + " |")
    return "\n".join(["", *lines, f"(every comparison per quartile: {names.BY_HISTORY}.md in MLflow)", ""])


LATENCY = "latency/request_mean_ms"  # one beam-search request at a time, per method (evaluation.latency_requests)
CONTEXT_AXES = {names.PROMPT_TOKENS_MEAN: "prompt tokens (mean over test users)",
                LATENCY: "ms per request (one beam search at a time, mean)"}


def context_figure(table, x: str, by: str | None = None):
    """NDCG@10 (its seeds-then-users 95% interval) against `x` (mean prompt tokens or ms/request): one line per
    method family across its contexts (`none`, `none-k5`, `none-k20`, ...: `methods.family`), each point labelled
    with the history items its prompt shows; the baselines, which have no prompt, as dotted lines. `by`: a column
    (the report's `study`) whose values get lines of their own. None where no row has `x`."""
    import plotly.graph_objects as go

    t = table[~table["method"].astype(str).str.contains("/")]
    if x not in t or not t[x].notna().any():
        return None
    t = t.assign(_family=t["method"].astype(str).map(methods.family))
    series = t["_family"] if by is None else t[by].astype(str) + " · " + t["_family"]
    t = t.assign(_series=series)
    fig = go.Figure()
    for name, g in t[t[x].notna()].groupby("_series", sort=False):
        g = g.sort_values(x)  # a line joins its points along the x axis
        n = g[names.CONTEXT_ITEMS] if names.CONTEXT_ITEMS in g else [math.nan] * len(g)  # a run before the column
        labels = [f"{int(v)} items" if v == v else m for v, m in zip(n, g["method"])]
        fig.add_scatter(x=g[x], y=g[N10], mode="lines+markers+text", name=str(name), text=labels,
                        textposition="top center", customdata=g[["method"]].to_numpy(),
                        error_y=dict(type="data", symmetric=False, array=(g[N10 + "_hi"] - g[N10]).tolist(),
                                     arrayminus=(g[N10] - g[N10 + "_lo"]).tolist()),
                        hovertemplate="%{customdata[0]} (%{text}): NDCG@10 %{y:.4f} at %{x:.1f}<extra></extra>")
    if by is None or t[by].nunique() == 1:
        for _, r in t[t[x].isna()].iterrows():
            fig.add_hline(y=r[N10], line_dash="dot", line_color="gray", annotation_text=str(r["method"]))
    what = "prompt length" if x == names.PROMPT_TOKENS_MEAN else "serving latency"
    fig.update_layout(title=f"Quality vs {what}: each method across its contexts (points: history items shown; "
                            "baselines, without a prompt, dotted)", xaxis_title=CONTEXT_AXES.get(x, x),
                      yaxis_title="NDCG@10 (95% CI over seeds and users)", template="plotly_white")
    return fig


def history_figure(by_history, by: str | None = None):
    """The comparison by history length (`slices.sliced_table`): NDCG@10 per method (own signal) on each quartile
    of the test users' history length (top), and each method's difference vs `none` there (bottom), with their
    seeds-then-users 95% intervals on the quartile's users: an effect confined to short histories shows as a bar
    off 0 on the left only. `by`: a column (the report's `study`) whose values get groups of their own."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    t = by_history[~by_history["method"].astype(str).str.contains("/")].copy()
    t["_x"] = t[names.SLICE].astype(str) if by is None else t[by].astype(str) + " · " + t[names.SLICE].astype(str)
    delta = f"vs_none/{N10}"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("NDCG@10", "NDCG@10 - none (same users)"))
    for i, (method, g) in enumerate(t.groupby("method", sort=False)):
        color = qualitative.Plotly[i % len(qualitative.Plotly)]  # a method's color in both panels
        users = g[[names.SLICE_USERS]].to_numpy()
        fig.add_bar(x=g["_x"], y=g[N10], name=str(method), legendgroup=str(method), marker_color=color,
                    error_y=error_bars(g, N10), customdata=users, row=1, col=1,
                    hovertemplate=f"{method} · %{{x}} (%{{customdata[0]}} users): %{{y:.4f}}<extra></extra>")
        if delta in g and g[delta].notna().any():
            fig.add_bar(x=g["_x"], y=g[delta], name=str(method), legendgroup=str(method), marker_color=color,
                        showlegend=False, error_y=error_bars(g, delta), customdata=users, row=2, col=1,
                        hovertemplate=f"{method} - none · %{{x}} (%{{customdata[0]}} users): %{{y:+.4f}}<extra></extra>")
    fig.add_hline(y=0, line_color="gray", row=2, col=1)
    fig.update_layout(title="Quality by user history length (quartiles of train + valid interactions; 95% CI over "
                            "seeds and the quartile's users)", barmode="group", template="plotly_white", height=640)
    fig.update_xaxes(title_text="history length (interactions)", row=2, col=1)
    return fig


def error_bars(df, key: str) -> dict:
    """A bar's asymmetric error bars from the `key_lo` / `key_hi` columns."""
    return dict(type="data", symmetric=False, array=(df[key + "_hi"] - df[key]).tolist(),
                arrayminus=(df[key] - df[key + "_lo"]).tolist())


def figures(table, trained, by_history=None) -> dict:
    """plotly figures: quality per method with intervals, quality vs prompt length and vs ms/request (each
    method's line across its contexts), validation NDCG@10 against training FLOPs (the compute-matched view),
    the user-signal ablation and, given the table by history length, quality by history length."""
    import plotly.graph_objects as go

    figs = {}
    fig = go.Figure()
    for metric in (N10, R10):
        fig.add_bar(name=metric.split("/")[1], x=table["method"], y=table[metric], error_y=error_bars(table, metric))
    fig.update_layout(title="Test quality per method (95% CI over seeds and users; seen items banned)",
                      barmode="group", yaxis_title="value")
    figs["quality_per_method.html"] = fig
    for x, file in ((names.PROMPT_TOKENS_MEAN, "quality_vs_prompt_length.html"),
                    (LATENCY, "quality_vs_ms_per_request.html")):
        fig = context_figure(table, x)
        if fig is not None:
            figs[file] = fig
    fig = go.Figure()
    for (method, seed), res in trained.items():
        h = [x for x in res.history if "epoch" in x]
        fig.add_scatter(x=[x[names.TRAIN_FLOPS] for x in h], y=[x[names.VALID_NDCG10] for x in h],
                        mode="lines+markers", name=f"{method} s{seed}")
    fig.update_layout(title="Validation NDCG@10 against training compute", xaxis_title="training FLOPs",
                      xaxis_type="log", yaxis_title="valid NDCG@10")
    figs["valid_ndcg_vs_train_flops.html"] = fig
    meth = table["method"].astype(str)
    abl = table[meth.str.contains("/") | meth.map(methods.family).isin(methods.reading_signal())]
    if len(abl):
        fig = go.Figure()
        fig.add_bar(x=abl["method"], y=abl[N10], error_y=error_bars(abl, N10))
        fig.update_layout(title="What the user signal carries: own vs shuffled vs zeroed", yaxis_title="NDCG@10")
        figs["signal_ablation.html"] = fig
    if by_history is not None and len(by_history):
        figs["quality_by_history_length.html"] = history_figure(by_history)
    return figs


def log_study(ctx, table, trained, by_history=None) -> None:
    """The table (CSV + markdown) and, given, the table by history length on the parent and the stage's run;
    the figures on the parent."""
    target = ctx.parent if ctx.parent is not None else ctx.run
    if target is None:
        return
    for run in {id(target): target, id(ctx.run): ctx.run}.values():
        if run is None:
            continue
        run.log_table(table, "comparison_table.csv")
        run.log_text(format_table(table, ctx.cfg), "comparison_table.md")
        if by_history is not None:
            run.log_table(by_history, f"{names.BY_HISTORY}.csv")
            run.log_text(slices_markdown(by_history), f"{names.BY_HISTORY}.md")
    for name, fig in figures(table, trained, by_history).items():
        target.log_figure(fig, name)
