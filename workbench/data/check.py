"""`workbench data check FILE`: what a researcher needs to know about a dataset before hours of training.

`prepare(cfg)` reads the study's dataset section (cached, readers.py), applies its filters and checks that the
item text the study's methods read exists; `summary(...)` is the printed page: users, items, interactions,
density, interactions per user (quantiles), time span, items without text, duplicates dropped, what the
filters removed, user features and embeddings coverage. The data stage runs the same `prepare`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np

from workbench import names
from workbench.data.files import UNITS, DataError
from workbench.data.readers import load_dataset
from workbench.data.tables import Dataset, filter_steps

QUANTILES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


@dataclass
class Prepared:
    """A study's dataset: the filtered tables, what reading counted, and what each filter left."""

    dataset: Dataset
    report: dict
    steps: list[dict]

    def stats(self) -> dict[str, float]:
        """Metrics for the data stage's run (on top of `Dataset.stats`)."""
        r = self.report
        out = {"data/duplicates_dropped": r.get("duplicates_dropped", 0),
               "data/missing_item_interactions": r.get("missing_items", {}).get("interactions", 0),
               "data/items_without_text": r.get("items_without_text", {}).get("count", 0)}
        for prev, step in zip(self.steps, self.steps[1:]):
            name = step["step"].split()[0]
            out[f"data/{name}_removed_users"] = prev["users"] - step["users"]
            out[f"data/{name}_removed_items"] = prev["items"] - step["items"]
        emb = r.get("user_embeddings")
        if emb:
            out["data/user_embeddings_coverage"] = emb["users_with"] / max(1, emb["users_with"] + emb["users_without"])
        return out


def text_readers(cfg) -> list[str]:
    """The parts of a study config that read item text (its Semantic IDs from text, the text_history prompts)."""
    out = []
    if cfg.semantic_ids.item_vectors in ("text", "both"):
        out.append(f"semantic_ids.item_vectors: {cfg.semantic_ids.item_vectors}")
    runs = [names.split_context_variant(m)[0] for m in cfg.methods.run]
    if "text_history" in runs or "text_history" in cfg.methods.contexts:
        out.append("methods.run: text_history" if "text_history" in runs else "methods.contexts: text_history")
    return out


def require_text(ds: Dataset, report: dict, cfg) -> str | None:
    """Refuse items without text when the study reads text (`dataset.items_without_text: fail`); the line to say
    when they fell back to their raw id; None when there is nothing to say."""
    nt = report.get("items_without_text", {})
    if not nt.get("count"):
        return None
    ex = ", ".join(map(repr, nt.get("examples", [])))
    if nt.get("action") == "fallback":
        return (f"{nt['count']} items have no text (first: {ex}): their text is their raw id "
                "(dataset.items_without_text: fallback)")
    readers = text_readers(cfg)
    if not readers:
        return f"{nt['count']} items have no text (first: {ex}); nothing in this study reads item text"
    raise DataError(f"{nt['count']} items have no text (first: {ex}), and {' and '.join(readers)} reads item "
                    "text; give them a title or text column (dataset.items.title / dataset.items.text), or set "
                    "dataset.items_without_text: fallback (their text is then their raw id)")


def prepare(cfg, say: Callable[[str], Any] = print) -> tuple[Prepared, str | None]:
    """The study's filtered dataset (read or from the cache) and the item-text note (`require_text`)."""
    d = cfg.dataset
    ds, report = load_dataset(d, say=say)
    note = require_text(ds, report, cfg)
    ds, steps = filter_steps(ds, d.min_rating, d.min_user_interactions, d.k_core)
    return Prepared(ds, report, steps), note


def _date(ts: int) -> str:
    return datetime.fromtimestamp(int(ts), tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def summary(p: Prepared, note: str | None = None) -> str:
    """The page `workbench data check` prints."""
    ds, r = p.dataset, p.report
    inter = ds.interactions
    per_user = inter.groupby(names.USER).size().to_numpy()
    q = np.quantile(per_user, QUANTILES)
    ts = inter[names.TIMESTAMP].to_numpy()
    lines = [f"dataset {ds.name} ({r.get('format')})"]
    lines += [f"  {role}: {path}" for role, path in r.get("files", {}).items()]
    unit = r.get("timestamp_unit")
    lines += [f"  timestamps: {UNITS.get(unit, unit)}", "read:",
              f"  rows read: {r.get('rows_read')}; duplicate (user, item, timestamp) rows dropped: "
              f"{r.get('duplicates_dropped', 0)}"]
    mi = r.get("missing_items", {})
    if mi.get("interactions"):
        lines.append(f"  interactions naming {mi['items']} items absent from the items file: {mi['interactions']} "
                     f"(dropped: dataset.missing_items: drop)")
    if "items_unused" in r:
        lines.append(f"  items file: {r['items_file_rows']} rows, {r['items_duplicate_rows']} repeated ids, "
                     f"{r['items_unused']} items nobody interacted with (left out)")
    nt = r.get("items_without_text", {})
    lines.append(f"  items without text: {nt.get('count', 0)}" + (f" -- {note}" if note else ""))
    lines.append("filters (users / items / interactions left):")
    lines += [f"  {s['step']:<28} {s['users']:>9} {s['items']:>9} {s['interactions']:>11}" for s in p.steps]
    lines += ["result:",
              f"  users {ds.n_users}, items {ds.n_items}, interactions {len(inter)}, density "
              f"{len(inter) / max(1, ds.n_users * ds.n_items):.5f}",
              "  interactions per user: " + ", ".join(f"{'min' if a == 0 else 'max' if a == 1 else f'p{a * 100:.0f}'} "
                                                      f"{v:g}" for a, v in zip(QUANTILES, q)),
              f"  time span: {_date(ts.min())} .. {_date(ts.max())} UTC ({(ts.max() - ts.min()) / 86400:.1f} days)"]
    uf = r.get("user_features")
    if uf:
        lines.append(f"  user features: numeric {uf['numeric'] or '-'}, categorical {uf['categorical'] or '-'}; "
                     f"users without a row: {uf['users_without']}")
    emb = r.get("user_embeddings")
    if emb:
        have = int(ds.user_embeddings[names.USER].nunique()) if ds.user_embeddings is not None else 0
        lines.append(f"  user embeddings: dim {emb['dim']}, {have} of {ds.n_users} users have one (the others: "
                     f"{emb['default']}), {emb['unknown_users_dropped']} rows of unknown users dropped; "
                     f"{emb['mark']}")
    return "\n".join(lines)
