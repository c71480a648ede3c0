"""The comparison table by user history length: quartiles of the test users' train + valid interaction counts.

An effect confined to short-history users (where a user signal should matter most: the prompt shows little) is
averaged away in the overall table. Here the test users are cut into quartiles of their history length, the edges
computed once over the test users (`history_quartiles`), and the whole comparison table (`compare.comparison_table`:
every method and baseline, every paired difference) is computed again on each quartile's users. A slice's intervals
are the same seeds-then-users bootstrap, restricted to that slice's users (same resamples and seed), so they are
wider than the overall ones: a quarter of the users.

Edges are integers: Q1 holds lengths <= e1, Q2 e1 < length <= e2, Q3 e2 < length <= e3, Q4 length > e3, with e the
25/50/75% quantiles (numpy's "lower" method: a length that occurs in the data). When many users share a length a
quartile may hold more or fewer than a quarter of them; an empty one (tied edges) is left out of the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from workbench.names import SLICE, SLICE_USERS
from workbench.study.compare import Entry


@dataclass(frozen=True)
class HistorySlices:
    """Which quartile of history length each test user is in (positions as in the evaluation's user order)."""

    edges: tuple[int, int, int]
    labels: tuple[str, str, str, str]
    of_user: np.ndarray  # [n_users] 0..3

    def mask(self, i: int) -> np.ndarray:
        return self.of_user == i


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo >= hi else f"{lo}-{hi}"


def history_quartiles(lengths: Sequence[int]) -> HistorySlices:
    """Quartile slices of `lengths` (each test user's train + valid interaction count, in evaluation order)."""
    x = np.asarray(lengths, dtype=np.int64)
    if x.ndim != 1 or len(x) == 0:
        raise ValueError(f"history_quartiles needs one length per test user, got shape {x.shape}")
    e1, e2, e3 = (int(v) for v in np.quantile(x, [0.25, 0.5, 0.75], method="lower"))
    labels = (f"Q1 (<= {e1})", f"Q2 ({_span(e1 + 1, e2)})", f"Q3 ({_span(e2 + 1, e3)})", f"Q4 (> {e3})")
    return HistorySlices((e1, e2, e3), labels, np.searchsorted(np.array([e1, e2, e3]), x, side="left"))


def restrict(entry: Entry, mask: np.ndarray) -> Entry:
    """The entry on the users of `mask` only; its costs (prompt tokens, FLOPs, ...) are not per user and stay out."""
    return Entry(entry.name, {s: {m: np.asarray(a)[mask] for m, a in per.items()} for s, per in entry.per_seed.items()})


def sliced_table(entries: dict[str, Entry], slices: HistorySlices, n_boot: int, seed: int,
                 same_context: dict[str, str] | None = None):
    """The comparison table once per non-empty slice, stacked; columns `slice`, `slice_users`, then the table's
    (`same_context`: as `compare.comparison_table`'s)."""
    import pandas as pd

    from workbench.study.compare import comparison_table

    parts = []
    for i, label in enumerate(slices.labels):
        mask = slices.mask(i)
        if not mask.any():
            continue
        t = comparison_table({n: restrict(e, mask) for n, e in entries.items()}, n_boot, seed, same_context)
        t.insert(0, SLICE_USERS, int(mask.sum()))
        t.insert(0, SLICE, label)
        parts.append(t)
    return pd.concat(parts, ignore_index=True)
