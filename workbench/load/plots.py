"""plotly figures of load sweeps, costs and the quality/cost trade-off.

Every function takes a pandas DataFrame (the tables `bench.py` logs and `report.py` rebuilds from
MLflow) and returns a `plotly.graph_objects.Figure`; nothing here reads MLflow or runs engines,
so notebooks, the bench and the report draw the same pictures from the same columns:

- points table (one row per rate point): `series`, `offered_qps`, `achieved_qps`, `e2e_p50_ms`,
  `e2e_p99_ms`, `failures`
- summary table (one row per engine x method x workload): `series`, `engine`, `method`,
  `saturation_qps`, `usd_per_1m`, and for the Pareto plots a quality column (e.g. `quality/recall@10`)
  and `e2e_p99_ms` (p99 at a common rate).

A line or bar is one run: rows are told apart by every column of `SERIES_KEYS` they carry that
differs between them (`series_labels`), so two sweeps of the same engine in two dtypes, or one
engine on two methods' checkpoints, never share a line or stack into one bar. Lines join their
points in the order of the x axis, not in the order they were measured.
"""

from __future__ import annotations

import math
from typing import Sequence

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


def _go():
    import plotly.graph_objects as go

    return go


def _colors(series: Sequence[str]) -> dict[str, str]:
    return {s: _PALETTE[i % len(_PALETTE)] for i, s in enumerate(dict.fromkeys(series))}


# What can tell two runs of a sweep apart, most telling first: the engine entry's label (`series`,
# the engine name by default), then dtype, mode, the checkpoint's method and the checkpoint itself,
# transport, workload, and last the sweep the run belongs to (two identical sweeps).
SERIES_KEYS: tuple[str, ...] = ("series", "engine", "dtype", "mode", "method", "checkpoint", "transport", "workload",
                                "sweep")


def _text(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v)


def series_labels(df, keys: Sequence[str] = SERIES_KEYS, sep: str = " · ") -> list[str]:
    """One label per row: the values of the `keys` columns that tell rows apart, joined by `sep`.

    The first present key is always used; a later key is added only when it splits rows the keys
    chosen so far leave together (so a label names the dtype only when two runs differ in dtype,
    and never repeats what an earlier key already says). Rows equal on every key share a label.
    """
    keys = [k for k in keys if k in df.columns]
    if not keys or len(df) == 0:
        return [""] * len(df)
    vals = df[keys].map(_text)
    chosen = [keys[0]]
    for k in keys[1:]:
        if (vals.groupby(chosen, sort=False)[k].nunique() > 1).any():
            chosen.append(k)
    return [sep.join(v for v in row if v) or "-" for row in vals[chosen].itertuples(index=False)]


def with_series(df, keys: Sequence[str] = SERIES_KEYS):
    """A copy of `df` whose `series` column is `series_labels(df, keys)` (what the figures group by)."""
    out = df.copy()
    if len(out):
        out["series"] = series_labels(out, keys)
    return out


def latency_vs_qps(points, slo_ms: float | None = None, title: str = "Latency vs achieved throughput"):
    """p50 (dashed) and p99 (solid) end-to-end latency against achieved QPS, one color per series."""
    go = _go()
    fig = go.Figure()
    points = with_series(points)
    colors = _colors(points["series"])
    for s, df in points.groupby("series", sort=False):
        df = df.sort_values(["achieved_qps", "offered_qps"])  # along the x axis: past saturation achieved drops
        for col, dash, lab in (("e2e_p99_ms", "solid", "p99"), ("e2e_p50_ms", "dash", "p50")):
            fig.add_trace(go.Scatter(
                x=df["achieved_qps"], y=df[col], mode="lines+markers", name=f"{s} {lab}", legendgroup=s,
                line=dict(color=colors[s], dash=dash),
                customdata=df[["offered_qps", "failures"]].to_numpy(),
                hovertemplate=f"{s} {lab}: %{{y:.1f}} ms at %{{x:.2f}} req/s"
                "<br>offered %{customdata[0]:.2f} req/s, failures %{customdata[1]}<extra></extra>",
            ))  # fmt: skip
    xs = points["achieved_qps"][points["achieved_qps"].map(math.isfinite)] if len(points) else []
    if slo_ms is not None and math.isfinite(slo_ms) and len(xs):
        # a trace, not add_hline: on this log axis plotly reads a shape's y as log10 of the value, so a line at
        # y=190 ms sat at 10^190 and the autorange followed it, flattening every series (reports before 2026-12-04)
        fig.add_trace(go.Scatter(x=[float(xs.min()), float(xs.max())], y=[slo_ms, slo_ms], mode="lines",
                                 name=f"SLO {slo_ms:.0f} ms", line=dict(color="black", dash="dot"),
                                 hovertemplate=f"SLO {slo_ms:.0f} ms<extra></extra>"))  # fmt: skip
    fig.update_layout(title=title, xaxis_title="achieved throughput (req/s)", yaxis_title="end-to-end latency (ms)",
                      yaxis_type="log", template="plotly_white", legend_title="engine")  # fmt: skip
    return fig


def throughput_vs_offered(points, title: str = "Achieved vs offered request rate"):
    """Achieved throughput against offered rate; the diagonal is "keeping up"."""
    go = _go()
    fig = go.Figure()
    points = with_series(points)
    colors = _colors(points["series"])
    for s, df in points.groupby("series", sort=False):
        df = df.sort_values(["offered_qps", "achieved_qps"])
        fig.add_trace(go.Scatter(x=df["offered_qps"], y=df["achieved_qps"], mode="lines+markers", name=s,
                                 line=dict(color=colors[s])))  # fmt: skip
    finite = points["offered_qps"][points["offered_qps"].map(math.isfinite)]
    if len(finite):
        hi = float(finite.max())
        fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="offered = achieved",
                                 line=dict(color="gray", dash="dot")))  # fmt: skip
    fig.update_layout(title=title, xaxis_title="offered rate (req/s)", yaxis_title="achieved throughput (req/s)",
                      template="plotly_white")  # fmt: skip
    return fig


def cost_bars(summary, title: str = "Cost per 1M requests at saturation"):
    """$ per 1M requests, one bar per run (labeled by what tells the runs apart), colored by method;
    runs without a saturation rate get a zero-height bar that says so (a missing bar would read as "not run")."""
    go = _go()
    fig = go.Figure()
    df = with_series(summary)
    df["method"] = df["method"].fillna("-") if "method" in df else "-"
    for method, g in df.groupby("method", sort=False):
        y = [c if math.isfinite(c) else 0.0 for c in g["usd_per_1m"]]
        text = [f"${c:.3g}" if math.isfinite(c) else "no rate inside SLO" for c in g["usd_per_1m"]]
        # one offset group: every x is one run, so bars never stack or squeeze into empty method slots
        fig.add_trace(go.Bar(x=g["series"], y=y, name=str(method), text=text, textposition="outside",
                             offsetgroup="run", cliponaxis=False))
    fig.update_layout(title=title, yaxis_title="USD per 1M requests", barmode="group", template="plotly_white",
                      legend_title="method")  # fmt: skip
    return fig


def pareto_front(x: Sequence[float], y: Sequence[float]) -> list[int]:
    """Indices of points not dominated by another (lower-or-equal x AND higher-or-equal y, one strictly)."""
    pts = [(i, a, b) for i, (a, b) in enumerate(zip(x, y)) if math.isfinite(a) and math.isfinite(b)]
    front = []
    for i, a, b in pts:
        if not any((a2 <= a and b2 >= b) and (a2 < a or b2 > b) for _, a2, b2 in pts):
            front.append(i)
    return sorted(front, key=lambda i: x[i])


def quality_pareto(summary, quality_col: str, x_col: str, x_title: str, title: str | None = None):
    """Quality against cost or latency, one marker per run (engine, dtype, method, ... as they differ),
    with the Pareto front drawn."""
    go = _go()
    df = summary.dropna(subset=[quality_col, x_col]).reset_index(drop=True)
    df = df[df[x_col].map(math.isfinite)].reset_index(drop=True)
    df = with_series(df)
    fig = go.Figure()
    colors = _colors(df["series"]) if len(df) else {}
    for s, g in df.groupby("series", sort=False):
        fig.add_trace(go.Scatter(
            x=g[x_col], y=g[quality_col], mode="markers+text", name=str(s), text=g["method"],
            textposition="top center", marker=dict(size=12, color=colors[s]),
        ))  # fmt: skip
    front = pareto_front(df[x_col].tolist(), df[quality_col].tolist()) if len(df) else []
    if len(front) > 1:  # one point is not a front to draw
        fig.add_trace(go.Scatter(x=df.loc[front, x_col], y=df.loc[front, quality_col], mode="lines",
                                 name="Pareto front", line=dict(color="black", dash="dash")))  # fmt: skip
    fig.update_layout(title=title or f"{quality_col} vs {x_title}", xaxis_title=x_title, yaxis_title=quality_col,
                      template="plotly_white")  # fmt: skip
    return fig


def matrix_heatmap(table, value: str, title: str, fmt: str, colorbar: str, notes: str | None = None):
    """One cell per (method, engine series) of the method x engine matrix (`load/matrix.py`), colored by `value`,
    each cell written out; a cell without a number carries its reason (`notes` column) instead of a color."""
    go = _go()
    methods = list(dict.fromkeys(table["method"]))
    series = list(dict.fromkeys(table["series"]))
    z = [[math.nan] * len(series) for _ in methods]
    text = [[""] * len(series) for _ in methods]
    for _, r in table.iterrows():
        i, j = methods.index(r["method"]), series.index(r["series"])
        v = r[value]
        ok = v is not None and math.isfinite(v)
        z[i][j] = float(v) if ok else math.nan
        text[i][j] = fmt.format(v) if ok else "-"
        if notes and r.get(notes):
            text[i][j] += f"<br><sub>{r[notes]}</sub>"
    fig = go.Figure(go.Heatmap(z=z, x=series, y=methods, text=text, texttemplate="%{text}", colorscale="Viridis",
                               colorbar=dict(title=colorbar), hoverongaps=False))
    fig.update_layout(title=title, xaxis_title="engine", yaxis_title="method", template="plotly_white")
    return fig


def matrix_pareto(table, title: str = "Quality vs cost, one front per engine"):
    """NDCG@10 of the quality sample (with its interval) against $ per 1M requests, one color and one Pareto front
    per engine series; cells costed at their serial capacity are drawn hollow."""
    go = _go()
    df = table[table["ndcg10"].map(lambda v: v is not None and math.isfinite(v))
               & table["usd_per_1m"].map(lambda v: v is not None and math.isfinite(v))].reset_index(drop=True)
    fig = go.Figure()
    colors = _colors(df["series"]) if len(df) else {}
    for s, g in df.groupby("series", sort=False):
        serial = g["cost_basis"].str.startswith("serial")
        fig.add_trace(go.Scatter(
            x=g["usd_per_1m"], y=g["ndcg10"], mode="markers+text", name=str(s), text=g["method"],
            textposition="top center",
            error_y=dict(type="data", symmetric=False, array=g["ndcg10_hi"] - g["ndcg10"],
                         arrayminus=g["ndcg10"] - g["ndcg10_lo"]),
            marker=dict(size=12, color=colors[s], symbol=["circle-open" if x else "circle" for x in serial]),
        ))  # fmt: skip
        front = pareto_front(g["usd_per_1m"].tolist(), g["ndcg10"].tolist())
        if len(front) > 1:
            gg = g.reset_index(drop=True)
            fig.add_trace(go.Scatter(x=gg.loc[front, "usd_per_1m"], y=gg.loc[front, "ndcg10"], mode="lines",
                                     name=f"{s} front", line=dict(color=colors[s], dash="dash"), showlegend=False))
    fig.update_layout(title=title, xaxis_title="USD per 1M requests (hollow: at serial capacity, no rate in SLO)",
                      yaxis_title="NDCG@10 (quality sample)", xaxis_type="log", template="plotly_white")
    return fig
