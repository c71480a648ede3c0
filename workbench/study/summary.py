"""The study's comparison table and figures: mean ± std over seeds, text table, plotly figures.

Separate from stages.py (which computes the rows) so notebooks and reports can format a table
they read back without importing the training and evaluation code.
"""

from __future__ import annotations

import math

from workbench import names

LABELS = {"text_history": "text_history", "popularity": "popularity (baseline)", "sasrec": "SASRec (baseline)"}


def summary_table(table):
    """Mean (± std over seeds when there are several) per method, in the order run."""
    import pandas as pd

    num = table.select_dtypes("number").columns.drop(["seed", "test_users"], errors="ignore")
    g = table.groupby("method", sort=False)[list(num)]
    mean = g.mean()
    if table.groupby("method").size().max() > 1:
        std = g.std().add_suffix("_std")
        mean = pd.concat([mean, std], axis=1)
    return mean.reset_index()


def format_table(table, cfg) -> str:
    """The comparison table as text (Recall/NDCG@10 with intervals vs none and vs popularity, prompt length,
    latency). With several seeds the intervals are averaged over seeds (each is a per-seed paired bootstrap)."""
    s = summary_table(table)
    r10, n10 = names.recall_at(10), names.ndcg_at(10)
    multi = any(c.endswith("_std") for c in s.columns)
    ex10 = r10.replace("quality/", "exhaustive/")
    exh = ex10 in s.columns and s[ex10].notna().any()  # evaluation.exhaustive: every item scored (no search error)
    lines = []
    hdr = f"{'method':27s} {'R@10':>14s} {'N@10':>14s} {'dR@10 vs none [95% CI]':>27s} {'dR@10 vs pop [95% CI]':>27s} {'R@30':>7s} {'MRR':>7s} {'valid':>6s} {'cov':>6s} {'tokens':>7s} {'ms/req':>7s} {'rerank N@10':>11s}" + (f" {'exhaustive R@10':>15s}" if exh else "")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for _, r in s.iterrows():
        def v(col, fmt="{:.4f}"):
            x = r.get(col, float("nan"))
            if x is None or (isinstance(x, float) and math.isnan(x)):
                return "-"
            out = fmt.format(x)
            if multi and f"{col}_std" in r and not math.isnan(r[f"{col}_std"]):
                out += "±" + fmt.format(r[f"{col}_std"])
            return out
        def ci(ref):
            dk = f"diff_vs_{ref}/" + r10.split("/")[1]
            if math.isnan(r.get(dk, float("nan"))):
                return "-"
            return f"{r[dk]:+.4f} [{r[dk + '_lo']:+.3f},{r[dk + '_hi']:+.3f}]"
        label = LABELS.get(r["method"], r["method"])
        if r["method"] == "text_history" and cfg.model.backbone == "tiny-qwen3":
            label = "text_history (no LM prior)"
        lines.append(
            f"{label:27s} {v(r10):>14s} {v(n10):>14s} {ci('none'):>27s} {ci('popularity'):>27s} {v(names.recall_at(30)):>7s} {v(names.MRR):>7s} "
            f"{v(names.SID_VALIDITY, '{:.3f}'):>6s} {v(names.COVERAGE, '{:.3f}'):>6s} {v(names.PROMPT_TOKENS_MEAN, '{:.0f}'):>7s} "
            f"{v('latency/request_mean_ms', '{:.1f}'):>7s} {v(n10.replace('quality/', 'rerank/')):>11s}"
            + (f" {v(ex10):>15s}" if exh else "")
        )
    n_users = int(table["test_users"].iloc[0])
    notes = [f"{cfg.name}: {cfg.dataset.name}, backbone {cfg.model.backbone}, {n_users} test users, beam {cfg.evaluation.beam_width}, "
             f"seen items banned; CI = paired bootstrap ({cfg.evaluation.bootstrap} resamples) over users."]
    if cfg.name.startswith("quickstart"):
        notes.append("SMOKE-QUALITY numbers: tiny model, short training, small sample. Use the ml1m/smollm2 experiments for findings.")
    if cfg.model.backbone == "tiny-qwen3":
        notes.append("tiny-qwen3 is trained from scratch: text_history has no language prior here.")
    return "\n".join(["", *lines, "", *notes, ""])


def figures(table, trained) -> dict:
    """plotly figures: quality per method (with CIs), quality vs prompt length, training curves."""
    import plotly.graph_objects as go

    s = summary_table(table)
    r10 = names.recall_at(10)
    figs = {}
    fig = go.Figure()
    for metric in (names.recall_at(10), names.ndcg_at(10)):
        fig.add_bar(name=metric.split("/")[1], x=s["method"], y=s[metric],
                    error_y=dict(type="data", array=s[f"{metric}_std"]) if f"{metric}_std" in s else None)
    fig.update_layout(title="Test quality per method (seen items banned)", barmode="group", yaxis_title="value")
    figs["quality_per_method.html"] = fig
    gen = s[s[names.PROMPT_TOKENS_MEAN].notna()] if names.PROMPT_TOKENS_MEAN in s else s.iloc[0:0]
    fig = go.Figure()
    fig.add_scatter(x=gen[names.PROMPT_TOKENS_MEAN], y=gen[r10], mode="markers+text", text=gen["method"],
                    textposition="top center", marker=dict(size=12))
    for _, r in s[s[names.PROMPT_TOKENS_MEAN].isna()].iterrows() if names.PROMPT_TOKENS_MEAN in s else []:
        fig.add_hline(y=r[r10], line_dash="dot", annotation_text=r["method"])
    fig.update_layout(title="Quality vs prompt length", xaxis_title="prompt tokens (mean)", yaxis_title="Recall@10")
    figs["quality_vs_prompt_length.html"] = fig
    fig = go.Figure()
    for (method, seed), res in trained.items():
        h = [x for x in res.history if "epoch" in x]
        fig.add_scatter(x=[x["epoch"] for x in h], y=[x["train_loss"] for x in h], name=f"{method} s{seed} loss")
        fig.add_scatter(x=[x["epoch"] for x in h], y=[x[names.VALID_RECALL10] for x in h], name=f"{method} s{seed} valid R@10",
                        yaxis="y2", line=dict(dash="dot"))
    fig.update_layout(title="Training curves", xaxis_title="epoch", yaxis_title="train loss",
                      yaxis2=dict(title="valid Recall@10", overlaying="y", side="right"))
    figs["training_curves.html"] = fig
    return figs


def log_study(ctx, table, trained) -> None:
    """The table (CSV + text) on the parent and the stage's run; the figures on the parent."""
    target = ctx.parent if ctx.parent is not None else ctx.run
    if target is None:
        return
    for run in {id(target): target, id(ctx.run): ctx.run}.values():
        if run is None:
            continue
        run.log_table(table, "comparison_table.csv")
        run.log_table(summary_table(table), "comparison_summary.csv")
        run.log_text(format_table(table, ctx.cfg), "comparison_table.txt")
    for name, fig in figures(table, trained).items():
        target.log_figure(fig, name)
