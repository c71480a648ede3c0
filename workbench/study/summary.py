"""The study's comparison table and figures, from the rows `compare.comparison_table` builds.

Separate from compare.py (which computes the rows) so notebooks and reports can format a table
they read back without importing the training and evaluation code. Every number in the table is a
mean over seeds and test users with its seeds-then-users bootstrap interval (`intervals.py`).
"""

from __future__ import annotations

import math

from workbench import names
from workbench.study import methods

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


def markdown_table(table) -> str:
    """The comparison as a markdown table (README-ready)."""
    cols = ["method", "seeds", "N@10 [95% CI]", "R@10", "MRR", "N@10 per seed", "vs none", "vs ALS", "vs EASE",
            "vs SASRec", "vs own signal", "prompt tokens", "train FLOPs", "ms/request", "best epoch / run"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.iterrows():
        r = r.to_dict()
        cells = [LABELS.get(r["method"], r["method"]), str(int(r["seeds"])), _mean_ci(r, N10), f"{r[R10]:.4f}",
                 f"{r[names.MRR]:.4f}", r.get("per_seed/" + N10, ""), _ci(r, f"vs_none/{N10}"), _ci(r, f"vs_als/{N10}"),
                 _ci(r, f"vs_ease/{N10}"), _ci(r, f"vs_sasrec/{N10}"), _ci(r, f"vs_own/{N10}"),
                 _num(r, names.PROMPT_TOKENS_MEAN, "{:.0f}"), _num(r, names.TRAIN_FLOPS, "{:.2e}"),
                 _num(r, "latency/request_mean_ms", "{:.1f}"), _epochs(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdicts(table) -> list[str]:
    """Each comparison of the table in words: which side its 95% interval puts ahead, or that it decides
    nothing (the interval holds 0: the difference is inside seed and user noise). A variant row
    (`method/shuffled`, `method/zeroed`) is read against its method's own signal; a pair the table holds both
    ways (ALS vs SASRec, SASRec vs ALS) is said once."""
    out, said = [], set()
    for _, r in table.iterrows():
        r = r.to_dict()
        name = r["method"]
        for tag in ("own", "none", "als", "ease", "sasrec"):
            key = f"vs_{tag}/{N10}"
            d = r.get(key)
            pair = frozenset((name, name.split("/")[0] if tag == "own" else tag))
            if d is None or (isinstance(d, float) and math.isnan(d)) or pair in said:
                continue
            said.add(pair)
            ref = (f"{name.split('/')[0]} with its own signal" if tag == "own"
                   else LABELS.get(tag, tag).removesuffix(" (baseline)"))  # the table's names: ALS, SASRec
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


def figures(table, trained) -> dict:
    """plotly figures: quality per method with intervals, quality vs prompt length, validation NDCG@10
    against training FLOPs (the compute-matched view), and the user-signal ablation."""
    import plotly.graph_objects as go

    figs = {}
    fig = go.Figure()
    for metric in (N10, R10):
        fig.add_bar(name=metric.split("/")[1], x=table["method"], y=table[metric],
                    error_y=dict(type="data", symmetric=False, array=table[metric + "_hi"] - table[metric],
                                 arrayminus=table[metric] - table[metric + "_lo"]))
    fig.update_layout(title="Test quality per method (95% CI over seeds and users; seen items banned)",
                      barmode="group", yaxis_title="value")
    figs["quality_per_method.html"] = fig
    gen = table[table[names.PROMPT_TOKENS_MEAN].notna()]
    fig = go.Figure()
    fig.add_scatter(x=gen[names.PROMPT_TOKENS_MEAN], y=gen[N10], mode="markers+text", text=gen["method"],
                    textposition="top center", marker=dict(size=12),
                    error_y=dict(type="data", symmetric=False, array=gen[N10 + "_hi"] - gen[N10],
                                 arrayminus=gen[N10] - gen[N10 + "_lo"]))
    for _, r in table[table[names.PROMPT_TOKENS_MEAN].isna()].iterrows():
        fig.add_hline(y=r[N10], line_dash="dot", annotation_text=r["method"])
    fig.update_layout(title="Quality vs prompt length", xaxis_title="prompt tokens (mean)", yaxis_title="NDCG@10")
    figs["quality_vs_prompt_length.html"] = fig
    fig = go.Figure()
    for (method, seed), res in trained.items():
        h = [x for x in res.history if "epoch" in x]
        fig.add_scatter(x=[x[names.TRAIN_FLOPS] for x in h], y=[x[names.VALID_NDCG10] for x in h],
                        mode="lines+markers", name=f"{method} s{seed}")
    fig.update_layout(title="Validation NDCG@10 against training compute", xaxis_title="training FLOPs",
                      xaxis_type="log", yaxis_title="valid NDCG@10")
    figs["valid_ndcg_vs_train_flops.html"] = fig
    abl = table[table["method"].str.contains("/") | table["method"].isin(methods.reading_signal())]
    if len(abl):
        fig = go.Figure()
        fig.add_bar(x=abl["method"], y=abl[N10], error_y=dict(type="data", symmetric=False,
                    array=abl[N10 + "_hi"] - abl[N10], arrayminus=abl[N10] - abl[N10 + "_lo"]))
        fig.update_layout(title="What the user signal carries: own vs shuffled vs zeroed", yaxis_title="NDCG@10")
        figs["signal_ablation.html"] = fig
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
    for name, fig in figures(table, trained).items():
        target.log_figure(fig, name)
