"""`workbench run`: an experiment's stages, each cached by the config that produced it, all in MLflow.

    ctx = run_experiment(load_study("experiments/quickstart.yaml"), "experiments/quickstart.yaml")

Stages run in a fixed order, each a function of a `StageContext` (`STAGES[name](ctx)`):

    data          MovieLens tables (filtered, dense ids) + time-ordered leave-one-out split
    embeddings    item text embeddings (MiniLM, when the item quantizer needs them) + ALS on train
    semantic_ids  item quantizer(s) + dedup digit, user quantizer, Catalog, figures
    train         workbench.study.stages.train.train_stage(ctx)      (imported only when run)
    evaluate      workbench.study.compare.evaluate_stage(ctx)

Caching (`workbench.cache.cached`): each stage's products live in `data/cache/<stage>/<key>/`,
where the key is `config.section_hash` of the config sections the stage reads plus the keys of the
stages it depends on, so re-running is instant and changing any knob a stage depends on recomputes
it (and everything downstream).

Tracking: one parent MLflow run per run of an experiment file (experiment name:
`tracking.experiment` or the config's `name`; store: `tracking.uri` or the environment's), one
child run per stage with its stats, timings and figures. A stage that raises ends its child and
the parent FAILED; earlier children stay FINISHED with everything they logged. Asking for a later
stage runs the stages it needs first (they are cache hits when nothing changed).

Under torchrun (`workbench.dist`) every rank runs the same stages in the same order; rank 0 alone
creates the runs and writes the caches, the other ranks run untracked beside it (training and
evaluation are shared, everything else they read from rank 0's cache entries).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from workbench import names
from workbench.config import ConfigError, StudyConfig, section_hash
from workbench.cache import cached
from workbench.study.context import NullRun, StageContext

STAGE_ORDER = names.STAGES
DEPENDS = {
    "data": (),
    "embeddings": ("data",),
    "semantic_ids": ("embeddings",),
    "train": ("semantic_ids",),
    "evaluate": ("train",),  # evaluates the models `train` picked (cache hits when nothing changed)
}
CACHE_FORMAT = 1  # bump to invalidate every cache written by an older layout of this module
SUPPORTED_TEXT_MODELS = ("all-MiniLM-L6-v2",)


def _say(msg: str) -> None:
    print(msg, flush=True)


# ---- stage: data --------------------------------------------------------------------------------
def stage_data(ctx: StageContext) -> None:
    from workbench.data.movielens import Dataset, filter_dataset, load_movielens
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

    (ds, split), info, ctx.cache_hits["data"] = cached("data", key, compute, load, say=_say)
    stats = info["stats"]
    ctx.dataset, ctx.split, ctx.keys["data"] = ds, split, key
    ctx.stats["data"] = stats
    ctx.run.log_metrics(stats)
    ctx.run.log_dict({"dataset": cfg.dataset.model_dump(), "split": cfg.split.model_dump()}, "stage_config.json")
    ctx.run.log_table(ds.items.head(50), "items_head.csv")
    _say(
        f"  {ds.name}: {ds.n_users} users, {ds.n_items} items, {len(ds.interactions)} interactions; "
        f"train {len(split.train)} rows (max_history {cfg.split.max_history})"
    )


# ---- stage: embeddings --------------------------------------------------------------------------
def _needs_text(cfg: StudyConfig) -> bool:
    return cfg.semantic_ids.item_vectors in ("text", "both")


def _als_valid_recall(als, split, k: int = 10) -> float:
    """Recall@k of each user's valid item from ALS scores, train items excluded (a sanity check)."""
    seqs = split.train_sequences()
    valid = split.valid_items()
    hits = 0
    for s in range(0, len(seqs), 1024):
        scores = als.user_factors[s : s + 1024] @ als.item_factors.T  # [b, n_items]
        for r, seq in enumerate(seqs[s : s + 1024]):
            scores[r, seq] = -np.inf
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        hits += int((top == valid[s : s + 1024, None]).any(1).sum())
    return hits / len(seqs)


def stage_embeddings(ctx: StageContext) -> None:
    from workbench.sids.embeddings import AlsFolds, AlsModel, fit_als, fit_als_folds, item_texts, text_embeddings

    cfg, emb = ctx.cfg, ctx.cfg.embeddings
    if emb.text_model not in SUPPORTED_TEXT_MODELS:
        raise ValueError(
            f"embeddings.text_model={emb.text_model!r} is not available offline; choose one of {SUPPORTED_TEXT_MODELS}"
        )
    stats: dict[str, float] = {}
    hits = []
    text = None
    text_key = None
    if _needs_text(cfg):
        text_key = section_hash("text", CACHE_FORMAT, emb.text_model, ctx.keys["data"])

        def compute_text(folder: Path):
            t0 = time.perf_counter()
            text = text_embeddings(item_texts(ctx.dataset.items), batch_size=emb.batch_size)
            np.save(folder / "text.npy", text)
            text_s = time.perf_counter() - t0
            return text, {"stats": {"time/compute/text_embeddings_s": text_s, "embeddings/text_dim": text.shape[1]}}

        text, info, hit = cached("text_embeddings", text_key, compute_text, lambda f, i: np.load(f / "text.npy"), _say)
        hits.append(hit)
        stats.update(info["stats"])
    als_part = emb.model_dump(exclude={"text_model", "batch_size"})
    als_key = section_hash("als", CACHE_FORMAT, als_part, cfg.seed, ctx.keys["data"])

    def compute_als(folder: Path):
        t0 = time.perf_counter()
        als = fit_als(
            ctx.split.train_sequences(),
            ctx.dataset.n_items,
            factors=emb.als_factors,
            iterations=emb.als_iterations,
            regularization=emb.als_regularization,
            alpha=emb.als_alpha,
            seed=cfg.seed,
        )
        fit_s = time.perf_counter() - t0
        als.save(folder / "als.npz")
        recall = _als_valid_recall(als, ctx.split)
        return als, {"stats": {"time/compute/als_s": fit_s, "embeddings/als_valid_recall_at_10": recall}}

    als, info, hit = cached("als", als_key, compute_als, lambda f, i: AlsModel.load(f / "als.npz"), _say)
    hits.append(hit)
    stats.update(info["stats"])
    folds_key = section_hash("als_folds", CACHE_FORMAT, emb.als_folds, als_key)

    def compute_folds(folder: Path):
        t0 = time.perf_counter()
        folds = fit_als_folds(ctx.split.train_sequences(), ctx.dataset.n_items, emb.als_folds, emb.als_factors,
                              emb.als_iterations, emb.als_regularization, emb.als_alpha, cfg.seed, reference=als)
        folds.save(folder / "folds")
        return folds, {"stats": {**folds.stats(), "time/compute/als_folds_s": time.perf_counter() - t0}}

    folds, info, hit = cached("als_folds", folds_key, compute_folds, lambda f, i: AlsFolds.load(f / "folds"), _say)
    hits.append(hit)
    stats.update(info["stats"])
    stats["embeddings/als_factors"] = als.factors
    ctx.text_vectors, ctx.als, ctx.als_folds = text, als, folds
    ctx.keys["embeddings"] = section_hash("embeddings", text_key, als_key, folds_key)
    ctx.cache_hits["embeddings"] = all(hits)
    ctx.stats["embeddings"] = stats
    ctx.run.log_metrics(stats)
    ctx.run.log_dict({"embeddings": emb.model_dump(), "text": _needs_text(cfg)}, "stage_config.json")
    recall = stats["embeddings/als_valid_recall_at_10"]
    _say(f"  ALS {als.factors} factors, valid recall@10 {recall:.4f}" + (f"; text {text.shape}" if text is not None else ""))


# ---- stage: semantic ids ------------------------------------------------------------------------
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
            _say(f"  fitting item quantizer {kind} ({sid.levels} levels x {sid.codebook_size} codes) on {x.shape}")
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

    (results, uq, ucodes), info, ctx.cache_hits["semantic_ids"] = cached("semantic_ids", key, compute, load, _say)
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
    _say(
        f"  item SIDs ({sid.kind}): utilization "
        + ", ".join(f"{main.stats[f'utilization_l{lvl}']:.0%}" for lvl in range(sid.levels))
        + f"; collision rate {main.stats['collision_rate']:.3f}; largest group {main.stats['max_prefix_group']}"
        + f"; dedup size {ctx.dedup_size}; user SIDs shared by {user_shared:.1%} of users"
    )


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


# ---- later stages (other modules, imported only when run) ---------------------------------------
def stage_train(ctx: StageContext) -> Any:
    from workbench.study.stages.train import train_stage

    return train_stage(ctx, build_inputs=study_inputs)


def study_inputs(cfg: StudyConfig):
    """The train stage's StudyInputs from the cached data stages, quietly: what a training worker (another process,
    `training.workers`) starts from; the main process ran and reported those stages already."""
    import contextlib
    import io

    from workbench.study.stages.train import inputs_from_context

    with contextlib.redirect_stdout(io.StringIO()):
        ctx = prepare_context(cfg)
    return inputs_from_context(ctx)


def stage_evaluate(ctx: StageContext) -> Any:
    from workbench.study.compare import evaluate_stage

    return evaluate_stage(ctx)


STAGES: dict[str, Callable[[StageContext], Any]] = {
    "data": stage_data,
    "embeddings": stage_embeddings,
    "semantic_ids": stage_semantic_ids,
    "train": stage_train,
    "evaluate": stage_evaluate,
}


def resolve_stages(requested) -> list[str]:
    """Requested stages plus everything they depend on, in pipeline order."""
    requested = list(requested)
    unknown = [s for s in requested if s not in STAGES]
    if unknown:
        raise ConfigError(f"unknown stage(s) {', '.join(map(str, unknown))}; valid stages: {', '.join(STAGE_ORDER)}")
    need: set[str] = set()

    def add(s: str) -> None:
        if s not in need:
            need.add(s)
            for d in DEPENDS[s]:
                add(d)

    for s in requested:
        add(s)
    return [s for s in STAGE_ORDER if s in need]


def _run_stage(ctx: StageContext, name: str, index: int, total: int) -> None:
    _say(f"[{index}/{total}] {name}")
    t0 = time.perf_counter()
    out = STAGES[name](ctx)
    if out is not None:
        ctx.products[name] = out
    ctx.timings[name] = time.perf_counter() - t0
    ctx.run.log_metrics({f"time/stage_{name}_s": ctx.timings[name]})
    if name in ctx.keys:
        hit = ctx.cache_hits.get(name, False)
        ctx.run.set_tags({names.TAG_CONFIG_HASH: ctx.keys[name], names.TAG_CACHE_HIT: hit})
    _say(f"  {name} done in {ctx.timings[name]:.1f}s" + (" (cached)" if ctx.cache_hits.get(name) else ""))


def run_experiment(cfg: StudyConfig, experiment_file: str | Path | None = None, stages=None) -> StageContext:
    """Run `stages` (default: the config's) with a parent MLflow run and one child run per stage.

    Runs go to the config's `tracking.uri` when it has one (a team server), else to the store the
    environment selects: entered here, once, so the CLI and the notebooks get it alike. Under torchrun
    only rank 0 logs; the other ranks run the same stages untracked, in step with it.
    """
    from workbench import dist, tracking

    if not dist.is_main():
        ctx = prepare_context(cfg, stages if stages else cfg.stages)
        ctx.experiment_file = str(experiment_file) if experiment_file else None
        return ctx
    with tracking.use(cfg.tracking.uri):
        return _run_tracked(cfg, experiment_file, stages)


def _run_tracked(cfg: StudyConfig, experiment_file: str | Path | None, stages) -> StageContext:
    from workbench import tracking

    order = resolve_stages(stages if stages else cfg.stages)
    ctx = StageContext(cfg=cfg, experiment_file=str(experiment_file) if experiment_file else None)
    experiment = cfg.experiment_name
    with tracking.start_run(
        cfg.name,
        experiment=experiment,
        config=cfg,
        experiment_file=ctx.experiment_file,
        tags={names.TAG_DATASET: cfg.dataset.name, names.TAG_STAGES: ",".join(order)},
    ) as parent:
        ctx.parent = parent
        try:
            for i, name in enumerate(order, 1):
                with tracking.start_run(name, parent=parent, tags={names.TAG_STAGE: name}) as run:
                    ctx.run = run
                    _run_stage(ctx, name, i, len(order))
                parent.log_metrics({f"time/stage_{name}_s": ctx.timings[name]})
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):  # Ctrl-C, or SIGTERM/SIGHUP (signals.Terminated): MLflow says KILLED
                status = f"KILLED ({str(e) or 'SIGINT'})"
            else:  # the first line: the exception itself follows with its traceback
                first = str(e).splitlines()[0] if str(e) else ""
                status = f"FAILED ({type(e).__name__}{': ' + first if first else ''})"
            _say(f"run {status}; what finished is kept.\n{tracking.ui_hint(parent.run_id)}")
            raise
        finally:
            ctx.run = None
        parent.log_dict({"keys": ctx.keys, "cache_hits": ctx.cache_hits, "timings": ctx.timings}, "stages.json")
    _say(f"parent run id: {parent.run_id}\n{tracking.ui_hint(parent.run_id)}")
    return ctx


def prepare_context(cfg: StudyConfig, stages=("data", "embeddings", "semantic_ids")) -> StageContext:
    """Run (or load from cache) stages without MLflow: for notebooks, tests and other stages' helpers."""
    ctx = StageContext(cfg=cfg)
    ctx.run = NullRun()
    order = resolve_stages(stages)
    for i, name in enumerate(order, 1):
        _run_stage(ctx, name, i, len(order))
    return ctx
