"""Plotly figures and tables that show what a Semantic-ID quantizer did to the catalog.

- `utilization_figure`: share of each level's codebook that some item uses, per quantizer kind
  (a level far below 1.0 wastes vocabulary and crowds items into few codes).
- `prefix_histogram`: how many items share each SID prefix, per prefix length (long tails mean big
  dedup digits and beams that compete inside one prefix).
- `shared_prefix_table` / `shared_prefix_figure`: titles that share a full SID prefix, the quick
  eyeball test of "does the SID group similar movies?".

Figures are returned, not shown: notebooks display them, the pipeline logs them to MLflow as HTML.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from workbench import names


def utilization_figure(stats_by_kind: Mapping[str, Mapping[str, float]], title: str = "Codebook utilization per level"):
    """Grouped bars: level on x, utilization on y, one bar group per quantizer kind."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for kind, stats in stats_by_kind.items():
        levels = sorted(int(k.rsplit("_l", 1)[1]) for k in stats if k.startswith("utilization_l"))
        fig.add_bar(
            name=kind,
            x=[f"level {lvl}" for lvl in levels],
            y=[stats[f"utilization_l{lvl}"] for lvl in levels],
            text=[f"{stats[f'utilization_l{lvl}']:.0%}" for lvl in levels],
            textposition="outside",
        )
    fig.update_layout(title=title, barmode="group", yaxis=dict(title="codes used / codebook size", range=[0, 1.1]))
    return fig


def prefix_group_sizes(codes: np.ndarray, prefix_len: int) -> np.ndarray:
    """Items per distinct prefix of length `prefix_len` (one entry per prefix)."""
    _, counts = np.unique(np.asarray(codes)[:, :prefix_len], axis=0, return_counts=True)
    return counts


def prefix_histogram(codes: np.ndarray, title: str = "Items per SID prefix"):
    """Histogram of items per prefix, one trace per prefix length 1..levels (codes before dedup)."""
    import plotly.graph_objects as go

    codes = np.asarray(codes)
    fig = go.Figure()
    for p in range(1, codes.shape[1] + 1):
        sizes = prefix_group_sizes(codes, p)
        fig.add_histogram(x=sizes, name=f"prefix length {p} ({len(sizes)} prefixes)", opacity=0.75)
    fig.update_layout(
        title=title, barmode="overlay", xaxis_title="items sharing the prefix", yaxis_title="number of prefixes"
    )
    return fig


def shared_prefix_table(
    codes: np.ndarray,
    items: pd.DataFrame,
    prefix_len: int | None = None,
    n_groups: int = 5,
    per_group: int = 6,
    seed: int = 0,
) -> pd.DataFrame:
    """Titles in `n_groups` random prefixes shared by >= 2 items (default prefix: all levels).

    Columns: prefix (e.g. "12-3-7"), group_size, item, title, genres.
    """
    codes = np.asarray(codes)
    prefix_len = prefix_len or codes.shape[1]
    keys, inverse, counts = np.unique(codes[:, :prefix_len], axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    shared = np.flatnonzero(counts >= 2)
    if len(shared) == 0:
        return pd.DataFrame(columns=["prefix", "group_size", names.ITEM, names.TITLE, names.GENRES])
    rng = np.random.default_rng(seed)
    pick = rng.choice(shared, size=min(n_groups, len(shared)), replace=False)
    rows = []
    for g in sorted(pick, key=lambda g: -counts[g]):
        members = np.flatnonzero(inverse == g)[:per_group]
        label = "-".join(str(int(c)) for c in keys[g])
        for i in members:
            year = items[names.YEAR].iloc[i]
            title = str(items[names.TITLE].iloc[i]) + ("" if pd.isna(year) else f" ({int(year)})")
            rows.append(
                {"prefix": label, "group_size": int(counts[g]), names.ITEM: int(i), names.TITLE: title,
                 names.GENRES: items[names.GENRES].iloc[i]}
            )  # fmt: skip
    return pd.DataFrame(rows)


def shared_prefix_figure(table: pd.DataFrame, title: str = "Titles sharing a SID prefix"):
    """A plotly table of `shared_prefix_table` output (logs as HTML next to the other figures)."""
    import plotly.graph_objects as go

    cols = ["prefix", "group_size", names.TITLE, names.GENRES]
    fig = go.Figure(
        go.Table(
            header=dict(values=cols, align="left"),
            cells=dict(values=[table[c].tolist() if c in table else [] for c in cols], align="left"),
        )
    )
    fig.update_layout(title=title)
    return fig


def genre_coherence(codes: np.ndarray, items: pd.DataFrame, prefix_len: int = 1) -> float:
    """Mean Jaccard overlap of genres between item pairs that share a prefix, minus the catalog mean.

    > 0 means items grouped by the SID prefix share more genres than random pairs do: a one-number
    answer to "does the SID group similar movies?".
    """
    sets = [frozenset(g.split("|")) - {"", "unknown"} for g in items[names.GENRES]]
    rng = np.random.default_rng(0)

    def jac(a: int, b: int) -> float:
        u = sets[a] | sets[b]
        return len(sets[a] & sets[b]) / len(u) if u else 0.0

    codes = np.asarray(codes)
    _, inverse = np.unique(codes[:, :prefix_len], axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    sorted_groups = inverse[order]
    same = []
    for _ in range(2000):
        i = int(rng.integers(len(codes)))
        lo, hi = np.searchsorted(sorted_groups, inverse[i]), np.searchsorted(sorted_groups, inverse[i], "right")
        group = order[lo:hi]
        if len(group) > 1:
            j = int(rng.choice(group[group != i]))
            same.append(jac(i, j))
    rand = [jac(int(a), int(b)) for a, b in rng.integers(len(codes), size=(2000, 2)) if a != b]
    return float(np.mean(same) - np.mean(rand)) if same and rand else 0.0
