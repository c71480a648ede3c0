"""The study's comparison table: one row per method or baseline, means over seeds and test users with intervals
that include seed variance, and the paired differences against the references.

Every comparison (method vs none, vs als, vs ease, vs sasrec; vs none at the same context; a variant vs its own
signal) is a seeds-then-users paired bootstrap (`intervals.seed_user_bootstrap`). The evaluate stage
(`stages/evaluate.py`) fills the `Entry`s; `summary.py` formats and logs the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench import names

REFERENCES = ("none", "als", "ease", "sasrec")  # what every row is compared with
SAME_CONTEXT = names.SAME_CONTEXT  # a method row vs `none` at as many history items (methods/variants.py)
TABLE_METRICS = (names.recall_at(10), names.ndcg_at(10), names.MRR)
# what a row cost, each the mean over its seeds (NaN where the row has none: a baseline has no prompt)
EXTRA_COLUMNS = (names.PROMPT_TOKENS_MEAN, names.CONTEXT_ITEMS, names.TRAIN_FLOPS, "latency/request_mean_ms",
                 names.SID_VALIDITY, names.BEST_EPOCH, names.EPOCHS_RUN)


@dataclass
class Entry:
    """One row of the study: per-seed per-user metrics plus what it cost."""

    name: str
    per_seed: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # seed -> metric -> [n_users]
    extra: dict[int, dict[str, float]] = field(default_factory=dict)  # seed -> prompt tokens, FLOPs, ms, ...

    def arrays(self, metric: str) -> list[np.ndarray]:
        return [self.per_seed[s][metric] for s in sorted(self.per_seed)]


def comparison_table(entries: dict[str, Entry], n_boot: int, seed: int, same_context: dict[str, str] | None = None):
    """One row per entry: mean metrics with seed-aware intervals, per-seed NDCG@10, and the paired
    differences vs none / als / ease / sasrec (and a signal variant vs its own signal); `same_context`
    ({row: the `none` row at its context}, `methods.same_context_references`) adds each such row vs that row."""
    import pandas as pd

    from workbench.study.intervals import mean_interval, seed_user_bootstrap

    n10 = names.ndcg_at(10)
    rows = []
    for name, e in entries.items():
        row: dict[str, Any] = {"method": name, "seeds": len(e.per_seed)}
        for metric in TABLE_METRICS:
            iv = mean_interval(e.arrays(metric), n_boot, seed)
            row[metric], row[f"{metric}_lo"], row[f"{metric}_hi"] = iv.mean, iv.lo, iv.hi
        row["per_seed/" + n10] = " ".join(f"{float(x.mean()):.4f}" for x in e.arrays(n10))
        refs = [r for r in REFERENCES if r != name and r in entries]
        if "/" in name:
            refs = [name.split("/")[0], *refs]
        for ref in refs:
            iv = seed_user_bootstrap(e.arrays(n10), entries[ref].arrays(n10), n_boot, seed)
            tag = "own" if "/" in name and ref == name.split("/")[0] else ref
            row[f"vs_{tag}/{n10}"], row[f"vs_{tag}/{n10}_lo"], row[f"vs_{tag}/{n10}_hi"] = iv.mean, iv.lo, iv.hi
        ref = (same_context or {}).get(name)
        row[SAME_CONTEXT] = ref if ref in entries else None
        if row[SAME_CONTEXT] is not None:
            iv = seed_user_bootstrap(e.arrays(n10), entries[ref].arrays(n10), n_boot, seed)
            key = f"vs_{SAME_CONTEXT}/{n10}"
            row[key], row[key + "_lo"], row[key + "_hi"] = iv.mean, iv.lo, iv.hi
        extras = list(e.extra.values())
        for key in EXTRA_COLUMNS:
            vals = [x[key] for x in extras if key in x]
            row[key] = float(np.mean(vals)) if vals else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)
