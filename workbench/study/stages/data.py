"""The data stage: the dataset's tables (read by `workbench.data`, filtered, dense ids) and their time-ordered
leave-one-out split.

Cached in `data/cache/data/<key>/`, the key a hash of the `dataset` and `split` sections (plus, for a dataset of
files or user embeddings, each file's fingerprint: `readers.read_key`). Items without text are refused here when
the study reads item text (`check.require_text`), on a cache hit too, since that depends on the methods. User
embeddings without `as_of` mark the run "may include the test period" (tag `names.TAG_USER_EMBEDDINGS`) and
print one warning.
"""

from __future__ import annotations

import time
from pathlib import Path

from workbench import names
from workbench.cache import cached
from workbench.config import section_hash
from workbench.study.context import StageContext, say

CACHE_FORMAT = 1  # bump to invalidate every cache written by an older layout of this module


def stage_data(ctx: StageContext) -> None:
    from workbench.data.check import prepare, require_text
    from workbench.data.readers import read_key
    from workbench.data.splits import Split, leave_one_out
    from workbench.data.tables import Dataset
    from workbench.data.user_embeddings import MAY_INCLUDE_TEST

    cfg = ctx.cfg
    files = [read_key(cfg.dataset)] if cfg.dataset.interactions or cfg.dataset.user_embeddings else []
    key = section_hash("data", CACHE_FORMAT, cfg.dataset, cfg.split, *files)

    def compute(folder: Path):
        t0 = time.perf_counter()
        prep, _ = prepare(cfg, say=say)
        ds = prep.dataset
        split = leave_one_out(ds.interactions, ds.n_users, ds.n_items, cfg.split.max_history)
        ds.save(folder / "dataset")
        split.save(folder / "split")
        stats = {**ds.stats(), **prep.stats(), **split.stats(), "time/compute/data_s": time.perf_counter() - t0}
        return (ds, split), {"stats": stats, "report": prep.report, "steps": prep.steps}

    def load(folder: Path, info: dict):
        ds = Dataset.load(folder / "dataset")
        return ds, Split.load(folder / "split", ds.n_users, ds.n_items, cfg.split.max_history)

    (ds, split), info, ctx.cache_hits["data"] = cached("data", key, compute, load, say=say)
    note = require_text(ds, info.get("report", {}), cfg)
    stats = info["stats"]
    ctx.dataset, ctx.split, ctx.keys["data"] = ds, split, key
    ctx.stats["data"] = stats
    ctx.run.log_metrics(stats)
    ctx.run.log_dict({"dataset": cfg.dataset.model_dump(), "split": cfg.split.model_dump()}, "stage_config.json")
    if "report" in info:
        ctx.run.log_dict({"report": info["report"], "filters": info["steps"]}, "data_report.json")
    ctx.run.log_table(ds.items.head(50), "items_head.csv")
    say(
        f"  {ds.name}: {ds.n_users} users, {ds.n_items} items, {len(ds.interactions)} interactions; "
        f"train {len(split.train)} rows (max_history {cfg.split.max_history})"
    )
    if note:
        say(f"  {note}")
    emb = info.get("report", {}).get("user_embeddings")
    if emb:
        for run in (ctx.run, ctx.parent):
            if run is not None:
                run.set_tags({names.TAG_USER_EMBEDDINGS: emb["mark"]})
        if emb["mark"] == MAY_INCLUDE_TEST:
            say(f"  warning: dataset.user_embeddings has no as_of column: the vectors {MAY_INCLUDE_TEST} (they may "
                "have been computed from interactions after the ones a model predicts); name dataset.user_embeddings"
                ".as_of to use only vectors from before each prompt")
