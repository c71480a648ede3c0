"""The data stage: MovieLens tables (filtered, dense ids) and their time-ordered leave-one-out split.

Cached in `data/cache/data/<key>/`, the key a hash of the `dataset` and `split` sections.
"""

from __future__ import annotations

import time
from pathlib import Path

from workbench.cache import cached
from workbench.config import section_hash
from workbench.study.context import StageContext, say

CACHE_FORMAT = 1  # bump to invalidate every cache written by an older layout of this module


def stage_data(ctx: StageContext) -> None:
    from workbench.data.movielens import load_movielens
    from workbench.data.tables import Dataset, filter_dataset
    from workbench.data.splits import Split, leave_one_out

    cfg = ctx.cfg
    key = section_hash("data", CACHE_FORMAT, cfg.dataset, cfg.split)

    def compute(folder: Path):
        t0 = time.perf_counter()
        ds = load_movielens(cfg.dataset.name)
        ds = filter_dataset(ds, cfg.dataset.min_rating, cfg.dataset.min_user_interactions)
        split = leave_one_out(ds.interactions, ds.n_users, ds.n_items, cfg.split.max_history)
        ds.save(folder / "dataset")
        split.save(folder / "split")
        return (ds, split), {"stats": {**ds.stats(), **split.stats(), "time/compute/data_s": time.perf_counter() - t0}}

    def load(folder: Path, info: dict):
        ds = Dataset.load(folder / "dataset")
        return ds, Split.load(folder / "split", ds.n_users, ds.n_items, cfg.split.max_history)

    (ds, split), info, ctx.cache_hits["data"] = cached("data", key, compute, load, say=say)
    stats = info["stats"]
    ctx.dataset, ctx.split, ctx.keys["data"] = ds, split, key
    ctx.stats["data"] = stats
    ctx.run.log_metrics(stats)
    ctx.run.log_dict({"dataset": cfg.dataset.model_dump(), "split": cfg.split.model_dump()}, "stage_config.json")
    ctx.run.log_table(ds.items.head(50), "items_head.csv")
    say(
        f"  {ds.name}: {ds.n_users} users, {ds.n_items} items, {len(ds.interactions)} interactions; "
        f"train {len(split.train)} rows (max_history {cfg.split.max_history})"
    )
