"""The semantic-IDs stage: the item quantizer(s) (`semantic_ids.kind` first, then `also_fit`) with the dedup
digit, the user quantizer over the ALS user vectors, the Catalog, and their figures; then the study's user signal
(`study/user_signal.py`: the source soft_token and user_sid read, with its own user quantizer where it needs one).

Cached in `data/cache/semantic_ids/<key>/`, keyed by the `semantic_ids` and `user_sids` sections, the seed and the
embeddings stage's key; its key is the `sid_version` every checkpoint trained on these SIDs carries.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from workbench import names
from workbench.cache import cached
from workbench.config import section_hash
from workbench.study.context import NullRun, StageContext, say

CACHE_FORMAT = 1  # bump to invalidate every cache written by an older layout of this module


def _prefixed(prefix: str, stats: dict) -> dict:
    return {f"{prefix}/{k}": v for k, v in stats.items()}


def stage_semantic_ids(ctx: StageContext) -> None:
    from workbench.sids.embeddings import item_vectors
    from workbench.sids.quantize import (
        ItemSids,
        code_stats,
        dedup_size_for,
        item_sids,
        load_quantizer,
        make_quantizer,
        make_quantizer_of_kind,
        quantizer_stats,
    )
    from workbench.sids.layout import Catalog, add_dedup_digit

    cfg = ctx.cfg
    sid, usid = cfg.semantic_ids, cfg.user_sids
    kinds = list(dict.fromkeys([sid.kind, *sid.also_fit]))  # downstream kind first, no repeats
    key = section_hash("semantic_ids", CACHE_FORMAT, sid, usid, cfg.seed, ctx.keys["embeddings"])
    x = item_vectors(sid.item_vectors, ctx.text_vectors, ctx.als.item_factors)

    def compute(folder: Path):
        results: dict[str, ItemSids] = {}
        timings: dict[str, float] = {}
        per_kind: dict[str, dict] = {}
        for kind in kinds:
            t0 = time.perf_counter()
            say(f"  fitting item quantizer {kind} ({sid.levels} levels x {sid.codebook_size} codes) on {x.shape}")
            res = item_sids(make_quantizer_of_kind(kind, sid, cfg.seed), x, show_progress=True)
            timings[f"time/compute/item_{kind}_s"] = time.perf_counter() - t0
            res.quantizer.save(folder / f"item_{kind}.npz")
            np.save(folder / f"item_codes_{kind}.npy", res.codes)
            results[kind] = res
            per_kind[kind] = res.stats
        t0 = time.perf_counter()
        uq = make_quantizer(usid, cfg.seed).fit(ctx.als.user_factors, show_progress=True)
        ucodes = uq.encode(ctx.als.user_factors)
        timings["time/compute/user_quantizer_s"] = time.perf_counter() - t0
        uq.save(folder / "user_quantizer.npz")
        np.save(folder / "user_codes.npy", ucodes)
        user_stats = quantizer_stats(uq, ctx.als.user_factors, ucodes)
        return (results, uq, ucodes), {"per_kind": per_kind, "user": user_stats, "timings": timings}

    def load(folder: Path, info: dict):
        results: dict[str, ItemSids] = {}
        for kind in kinds:
            codes = np.load(folder / f"item_codes_{kind}.npy")
            results[kind] = ItemSids(
                kind=kind,
                quantizer=load_quantizer(folder / f"item_{kind}.npz"),
                codes=codes,
                item_codes=add_dedup_digit(codes),
                stats=info["per_kind"][kind],
            )
        return results, load_quantizer(folder / "user_quantizer.npz"), np.load(folder / "user_codes.npy")

    (results, uq, ucodes), info, ctx.cache_hits["semantic_ids"] = cached("semantic_ids", key, compute, load, say)
    user_stats, timings = info["user"], info["timings"]

    main = results[sid.kind]
    ctx.item_vectors, ctx.item_sids = x, results
    ctx.item_codes = main.item_codes
    ctx.item_codebooks = tuple(main.quantizer.codebook_sizes)
    ctx.dedup_size = dedup_size_for(main.max_dedup)
    ctx.user_quantizer, ctx.user_codes = uq, ucodes
    ctx.catalog = Catalog(main.item_codes, ctx.layout(0))
    ctx.keys["semantic_ids"] = key

    from workbench.sids.figures import genre_coherence

    stats: dict[str, float] = {**timings}
    for kind, res in results.items():
        stats.update(_prefixed(f"sid_{kind}", res.stats))
        stats[f"sid_{kind}/genre_coherence_l1"] = genre_coherence(res.codes, ctx.dataset.items, 1)
    stats.update(_prefixed("sid", main.stats))
    stats["sid/genre_coherence_l1"] = stats[f"sid_{sid.kind}/genre_coherence_l1"]
    stats["sid/dedup_size"] = ctx.dedup_size
    user_shared = code_stats(ucodes, uq.codebook_sizes)["collision_rate"]
    stats.update(_prefixed("user_sid", user_stats))
    stats[names.USER_SID_SHARED] = user_shared
    ctx.stats["semantic_ids"] = stats
    ctx.run.log_metrics(stats)
    ctx.run.set_tags({names.TAG_SID_KIND: sid.kind, names.TAG_SID_VERSION: key})
    ctx.run.log_dict(
        {"semantic_ids": sid.model_dump(mode="json"), "user_sids": usid.model_dump(mode="json"),
         "layout": ctx.layout(0).to_dict()},
        "stage_config.json",
    )  # fmt: skip
    _log_sid_figures(ctx, results, user_stats)
    say(
        f"  item SIDs ({sid.kind}): utilization "
        + ", ".join(f"{main.stats[f'utilization_l{lvl}']:.0%}" for lvl in range(sid.levels))
        + f"; collision rate {main.stats['collision_rate']:.3f}; largest group {main.stats['max_prefix_group']}"
        + f"; dedup size {ctx.dedup_size}; user SIDs shared by {user_shared:.1%} of users"
    )
    from workbench.study.user_signal import build_user_signal

    build_user_signal(ctx)  # its own cache entries: the source never changes this stage's key (sid_version)


def _log_sid_figures(ctx: StageContext, results: dict, user_stats: dict) -> None:
    from workbench.sids import figures as sf

    run = ctx.run
    if isinstance(run, NullRun):
        return
    main = results[ctx.cfg.semantic_ids.kind]
    run.log_figure(sf.utilization_figure({k: r.stats for k, r in results.items()}), "figures/sid_utilization.html")
    run.log_figure(sf.prefix_histogram(main.codes), "figures/sid_items_per_prefix.html")
    table = sf.shared_prefix_table(main.codes, ctx.dataset.items, seed=ctx.cfg.seed)
    run.log_figure(sf.shared_prefix_figure(table), "figures/sid_shared_prefix_titles.html")
    run.log_table(table, "sid_shared_prefix_titles.csv")
    run.log_figure(
        sf.utilization_figure({"user " + ctx.cfg.user_sids.kind: user_stats}, "User SID codebook utilization"),
        "figures/user_sid_utilization.html",
    )
