"""The train stage (`train_stage(ctx)`): one model per (method, seed, learning rate), the LR picked on validation.

For every method in `methods.run` and every context variant of `methods.contexts` (`methods.study_methods`; a
variant is its own model: `methods/variants.py`) and every seed in `training.seeds`, train one model per learning
rate of `training.lr_grid` on full-sequence windows (`windows.py`: every train transition a target
once per epoch), keep the one with the best validation NDCG@10; one MLflow child run per (method,
seed, lr). The evaluate stage (`stages/evaluate.py`) then evaluates the picked models. With `training.workers` > 1,
several models train at a time, each in its own process ("training workers" below); when the run includes the
evaluate stage the workers also train its SASRecs and evaluate each model once its grid is trained, into the cache
entries that stage reads (`sasrec_models.py`, `model_evals.py`).

Caching (resume after an interruption; `workbench.cache.cached`): every trained model lives in
`data/cache/train/<key>/` (checkpoint; its TrainResult in done.json, written last; while it trains,
`resume.pt` holds the state after the last finished epoch, so a stopped run resumes there; the key and the
folder: `inputs.py`). Keys hash the config sections training reads plus the upstream stage keys, so a changed
knob recomputes exactly what depends on it. Under torchrun (`workbench.dist`) rank 0 writes every entry, which
all ranks compute together (`cached(..., collective=True)`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from workbench import names
from workbench.cache import cached
from workbench.config import settings_from
from workbench.errors import UsageError
from workbench.study import methods, model_evals, sasrec_models
from workbench.study.context import child_run, say
from workbench.study.inputs import (StudyInputs, inputs_from_context, set_threads, test_users, train_entry, train_key,
                                    use_threads)


# ---- training -------------------------------------------------------------------------------------


def build_prompt_builder(cfg, backbone, inp: StudyInputs, method: str):
    from workbench.study.prompts import PromptBuilder, tokenize_item_texts

    text_ids = tokenize_item_texts(backbone.tokenizer, inp.item_texts) if methods.get(method).needs_text else None
    depth = backbone.layout.item_depth
    return PromptBuilder(
        method, backbone.layout, backbone.layout.item_codes_to_ids(inp.item_codes), cfg.methods.recent_k,
        cfg.methods.long_m, text_ids, max_prompt_tokens=backbone.max_positions - depth,
    )


def new_backbone(cfg, inp: StudyInputs, seed: int):
    from workbench.model.backbone import build_backbone

    return build_backbone(cfg.model, inp.item_texts, inp.item_codebooks, inp.dedup_size, inp.user_codebooks, seed=seed)


def valid_users(cfg, inp: StudyInputs, seed: int) -> np.ndarray:
    n = inp.interactions.n_users
    rng = np.random.default_rng(10_000 + seed)
    return np.sort(rng.choice(n, size=min(n, cfg.training.valid_users), replace=False))


def train_one(cfg, inp: StudyInputs, method: str, seed: int, lr: float, log_fn=None):
    """Train (or load from cache) one (method, seed, lr); returns (TrainResult, cache hit)."""
    from workbench.study.train import TrainResult

    def load(folder: Path, info: dict):
        res = TrainResult.from_entry(folder, info)
        if not res.checkpoint.exists():
            raise KeyError(f"checkpoint {res.checkpoint} missing")
        return res

    def compute(folder: Path):
        res = _train(cfg, inp, method, seed, lr, folder, log_fn)
        return res, res.to_dict()

    # resumable: training saves its state after every epoch in the entry; an interrupted run goes on from there
    # collective: under torchrun every rank trains (its share of each batch), rank 0 writes the entry
    res, _, hit = cached("train", train_key(cfg, inp, method, lr, seed), compute, load, say, resumable=True,
                         collective=True)
    return res, hit


def _train(cfg, inp: StudyInputs, method: str, seed: int, lr: float, folder: Path, log_fn):
    from workbench.study.train import train_model

    t = training_parts(cfg, inp, method, seed, lr)
    return train_model(t.backbone, t.windows, t.valid_set, t.item_codes, folder, t.settings, t.sid_version, t.user_dim,
                       log_fn=log_fn)


def training_parts(cfg, inp: StudyInputs, method: str, seed: int, lr: float, say_windows: bool = True):
    """What `train_model` trains for one (method, seed, lr): backbone, windows(rng), validation set, item codes,
    settings, SID version and user vector size. The one place the study and `workbench trainbench` build a
    training run from a config."""
    from workbench.study.prompts import eval_examples
    from workbench.study.train import TrainSettings
    from workbench.study.windows import WindowBuilder

    bb = new_backbone(cfg, inp, seed)
    builder = build_prompt_builder(cfg, bb, inp, method)
    wb = WindowBuilder(builder, max_tokens=builder.max_prompt_tokens)
    valid_set = eval_examples(builder, inp.interactions, "valid", inp.encoder, users=valid_users(cfg, inp, seed))
    st = settings_from(TrainSettings, cfg.training, cfg.model, lr=lr, seed=seed)

    def windows(rng):
        ws = wb.epoch(inp.interactions.train, inp.encoder, rng)
        if say_windows:
            say(f"  {method} seed={seed} lr={lr:g}: {len(ws)} windows, {ws.n_targets} item targets, "
                f"{int(ws.lengths().sum())} tokens (mean window {ws.lengths().mean():.0f})")
        return ws

    user_dim = inp.encoder.dim if methods.get(method).signal == methods.VECTOR else None
    return TrainingParts(bb, windows, valid_set, inp.item_codes, st, inp.sid_version, user_dim)


def training_run(cfg, inp: StudyInputs, method: str, seed: int, folder: Path):
    """A started training run of (method, seed, the grid's first LR) whose steps the caller drives (`workbench
    trainbench`): the study's backbone, first-epoch windows, batches, optimizer and step; nothing cached."""
    from workbench.study.train import start_training

    t = training_parts(cfg, inp, method, seed, float(cfg.training.lr_grid[0]), say_windows=False)
    return start_training(t.backbone, t.windows, t.valid_set, t.item_codes, folder, t.settings, t.sid_version,
                          t.user_dim)


class TrainingParts(NamedTuple):
    backbone: Any
    windows: Callable
    valid_set: Any
    item_codes: np.ndarray
    settings: Any
    sid_version: str
    user_dim: int | None


def longest_first(cfg, jobs: list[tuple]) -> list[tuple]:
    """The jobs in the order the workers should take them: the longest to train first, so that no worker starts
    the longest model when the others are nearly done. On ML-1M with 2 workers, text_history's training is ~90 min
    by its step rate and each other method's a fraction of that: in the config's order it would start only when
    the first of none / none_long finished, and the stage would end that much after the other worker. A model's cost grows with its window tokens: text first (a history item is a title of ~10
    tokens instead of a 3-token SID), then the longer context; ties keep the config's order."""
    def cost(job):
        spec = methods.get(job[0])
        return (spec.needs_text, spec.context_items(cfg.methods.recent_k, cfg.methods.long_m))

    return sorted(jobs, key=cost, reverse=True)  # sorted() is stable: ties stay in the config's order


def pick_lr(results: list[tuple[float, Any]]) -> tuple[float, Any]:
    """(lr, TrainResult) with the best validation NDCG@10 among one (method, seed)'s grid, in the grid's order (a
    tie keeps the earlier LR), whatever order the models finished in."""
    best = results[0]
    for lr, res in results[1:]:
        if res.best_valid_ndcg10 > best[1].best_valid_ndcg10:
            best = (lr, res)
    return best


def train_stage(ctx, build_inputs: Callable[[Any], StudyInputs] | None = None) -> dict:
    """Train every (method, seed), picking the LR per method on validation; returns {(method, seed): result}.

    One MLflow child run per (method, seed, lr). With `training.workers` > 1 the models not in the cache yet train
    in that many processes at a time ("training workers" below), and each one's run is logged here when it
    finishes; `build_inputs(cfg)` (a module-level function: the runner's) rebuilds the StudyInputs in a worker."""
    from workbench import dist

    cfg = ctx.cfg
    use_threads(cfg)
    inp = inputs_from_context(ctx)
    jobs = [(m, s, lr) for m in methods.study_methods(cfg.methods) for s in cfg.training.seeds
            for lr in cfg.training.lr_grid]
    done: dict[tuple, tuple[Any, bool]] = {}  # job -> (TrainResult, cache hit)
    todo = [job for job in jobs if train_entry(cfg, inp, *job)[1] is None]
    # the evaluate stage's SASRecs need nothing trained here: with workers they train beside the models, last; and
    # each model's evaluations join the queue once the model is trained (model_evals.py)
    evaluate = "evaluate" in ctx.stages
    sasrec_todo = sasrec_models.missing(cfg, inp) if evaluate else []
    if cfg.training.workers > 1 and len(todo) + len(sasrec_todo) > 1:
        if dist.world().size > 1:
            raise UsageError("training.workers > 1 does not combine with torchrun (every rank already trains its "
                             "share of each model); set training.workers: 1")
        if build_inputs is None:
            raise ValueError("training.workers > 1: train_stage needs build_inputs (pipeline.study_inputs)")
        from workbench.study.workers import side_by_side

        users = test_users(cfg, inp)
        trained = {job: None for job in todo}  # job -> TrainResult, once its worker is done

        def evaluations(method: str, seed: int) -> list[tuple]:
            """The missing evaluations of (method, seed)'s picked model, once every LR of its grid is trained."""
            grid = [(method, seed, lr) for lr in cfg.training.lr_grid]
            if not evaluate or any(job in trained and trained[job] is None for job in grid):
                return []
            res = [trained[job] if job in trained else _trained_by_worker(cfg, inp, *job) for job in grid]
            lr, best = pick_lr([(job[2], r) for job, r in zip(grid, res)])
            return model_evals.missing(cfg, inp, method, seed, lr, best.checkpoint, users)

        cached_models = {(m, s) for m, s, _ in jobs} - {(m, s) for m, s, _ in todo}
        queue = longest_first(cfg, todo) + sasrec_todo + [e for ms in sorted(cached_models) for e in evaluations(*ms)]
        n = min(cfg.training.workers, len(queue))
        also = f" and {len(sasrec_todo)} SASRec baseline(s) for the evaluate stage" if sasrec_todo else ""
        after = ", then its evaluations" if evaluate else ""
        say(f"  training {len(todo)} models{also}, {n} at a time in worker processes ({threads_per_worker(cfg)} "
             f"thread(s) each); each model's run is logged when it finishes{after}")

        def finished(job, fut) -> list[tuple]:
            if job[0] == sasrec_models.JOB:  # its run is the evaluate stage's baseline/sasrec (the curve replayed)
                _worker_result(job, fut)
                say(f"  SASRec seed={job[1]} lr={job[2]:g}: trained in a worker (cached for the evaluate stage)")
                return []
            if job[0] == model_evals.JOB:  # its run is the evaluate stage's (a cache hit there)
                _worker_result(job, fut)
                _, method, seed, _, variant = job
                name = method if variant == "own" else f"{method}/{variant}"
                say(f"  {name} seed={seed}: evaluated in a worker (cached for the evaluate stage)")
                return []
            with _train_run(ctx, *job) as run:
                logged = _worker_result(job, fut)
                res = _trained_by_worker(cfg, inp, *job)
                for metrics, step in logged:
                    run.log_metrics(metrics, step)
                _log_train(run, res, hit=False)
            done[job] = (res, False)
            trained[job] = res
            _say_trained(job, res, hit=False)
            return evaluations(job[0], job[1])

        side_by_side(queue, n, _worker_train, finished, init=_worker_init,
                     init_args=(cfg, inp.upstream_key, build_inputs))
    for job in jobs:
        if job in done:
            continue
        with _train_run(ctx, *job) as run:
            res, hit = train_one(cfg, inp, *job, log_fn=run.log_metrics)
            if hit:  # the curves of a cached model, logged again on this run
                for row in res.history:
                    if "epoch" in row:
                        run.log_metrics({names.TRAIN_EPOCH_LOSS: row["train_loss"],
                                         names.VALID_NDCG10: row[names.VALID_NDCG10],
                                         names.VALID_RECALL10: row[names.VALID_RECALL10],
                                         names.TRAIN_FLOPS: row[names.TRAIN_FLOPS]}, row["step"])
            _log_train(run, res, hit)
        done[job] = (res, hit)
        _say_trained(job, res, hit)
    best: dict[tuple[str, int], Any] = {}
    for method, seed in dict.fromkeys((m, s) for m, s, _ in jobs):
        best[(method, seed)] = pick_lr([(lr, done[(method, seed, lr)][0]) for lr in cfg.training.lr_grid])[1]
    grid_log = [{"method": m, "seed": s, "lr": lr, "valid_ndcg10": done[(m, s, lr)][0].best_valid_ndcg10,
                 "cached": done[(m, s, lr)][1]} for m, s, lr in jobs]
    ctx.run.log_dict(grid_log, "lr_grid.json")
    ctx.products["train"] = best
    return best


# ---- training workers (`training.workers`) ---------------------------------------------------------
# Why: a study trains many small models (methods x seeds x learning rates), and a small model spends a thread
# badly: its GEMMs are too thin to split and every parallel region waits for the slowest thread. Measured on an
# AMD EPYC Zen 4 (2 cores, the quickstart's `none`, one epoch, 2026-12-02): one process with 2 threads trained
# 23.3k tokens/s, with 1 thread 15.4k, and two 1-thread processes side by side 17.2k + 18.8k = 36.1k, 1.55x the
# 2-thread process; the quickstart's train stage took 594 s in one 2-thread process, 447 s with 2 workers.
# What stays the same: a model trains in its worker as it would alone in this process with as many threads (the same
# seeds, windows, batches and `train_one` call; tests/test_train_workers.py checks the weights equal), so
# `workers` is in no cache key. A worker's thread count sets its rounding, as `num_threads` does in one process.
# The processes, their stopping and their output: workers.py.
_worker: dict[str, Any] = {}  # in a training worker: its config and study inputs


def threads_per_worker(cfg) -> int:
    """Threads of each training worker: `num_threads` (default: every core) split between the workers, at least 1."""
    from workbench.study.workers import cpus

    return max(1, (cfg.training.num_threads or cpus()) // cfg.training.workers)


def _worker_init(cfg, upstream_key: str, build_inputs: Callable[[Any], StudyInputs]) -> None:
    set_threads(threads_per_worker(cfg))
    inp = build_inputs(cfg)
    if inp.upstream_key != upstream_key:
        raise RuntimeError(f"a training worker built other study inputs ({inp.upstream_key}) than the main process "
                           f"({upstream_key}): the data cache changed under the run; run it again")
    _worker.update(cfg=cfg, inputs=inp)


def _worker_train(job) -> list[tuple[dict, int]]:
    """Train one (method, seed, lr) in this worker, or one SASRec (`sasrec_models.JOB`, seed, lr) into its cache
    entry, or evaluate a trained model (`model_evals.JOB`, method, seed, lr, variant) into its cache entry; returns
    the metrics a model logged, as (metrics, step) in order."""
    cfg, inp = _worker["cfg"], _worker["inputs"]
    if job[0] == sasrec_models.JOB:
        sasrec_models.sasrec_model(cfg, inp, job[1], job[2])
        return []
    if job[0] == model_evals.JOB:
        _, method, seed, lr, variant = job
        res = _trained_by_worker(cfg, inp, method, seed, lr)
        model_evals.evaluate_method(cfg, inp, method, res, test_users(cfg, inp), None, variant=variant)
        return []
    logged: list[tuple[dict, int]] = []
    train_one(cfg, inp, *job, log_fn=lambda m, step: logged.append((dict(m), step)))
    return logged


def _train_run(ctx, method: str, seed: int, lr: float):
    tags = {names.TAG_STAGE: "train", names.TAG_METHOD: method, names.TAG_SEED: seed, names.TAG_LR: lr}
    return child_run(ctx, f"train/{method}/seed{seed}/lr{lr:g}", tags)


def _worker_result(job, fut) -> list[tuple[dict, int]]:
    """The metrics a worker logged for `job`, or a clear error where the worker failed or died."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        return fut.result()
    except BrokenProcessPool as e:
        what = f"evaluating {job[1]} ({job[4]}) seed={job[2]}" if job[0] == model_evals.JOB else \
            f"training {job[0]} seed={job[1]} lr={job[2]:g}"
        raise RuntimeError(f"the worker process {what} died (killed, out of memory, or its start failed: its output "
                           "is above); what finished is cached, run the study again to resume") from e


def _trained_by_worker(cfg, inp: StudyInputs, method: str, seed: int, lr: float):
    """The TrainResult a worker stored for this model (read, never trained here: a missing entry is a bug)."""
    from workbench.study.train import TrainResult

    folder, info = train_entry(cfg, inp, method, seed, lr)
    if info is None:
        raise RuntimeError(f"the worker that trained {method} seed={seed} lr={lr:g} left no complete entry in {folder}")
    return TrainResult.from_entry(folder, info)


def _log_train(run, res, hit: bool) -> None:
    run.log_metrics({names.BEST_VALID_NDCG10: res.best_valid_ndcg10,
                     names.BEST_VALID_RECALL10: res.best_valid_recall10, names.BEST_EPOCH: res.best_epoch,
                     names.EPOCHS_RUN: res.epochs_run, "train/steps": res.steps,
                     "train/tokens": res.train_tokens, names.TRAIN_FLOPS: res.flops,
                     "train/wall_s": res.wall_s, names.TRAIN_TOKENS_PER_S: res.tokens_per_s,
                     names.TRAIN_MATMUL_SHARE: res.matmul_share, "train/bf16": float(res.bf16)})
    run.set_tags({names.TAG_CACHE_HIT: hit, names.TAG_CHECKPOINT: str(res.checkpoint)})


def _say_trained(job, res, hit: bool) -> None:
    method, seed, lr = job
    say(f"  {method} seed={seed} lr={lr:g}: valid NDCG@10 {res.best_valid_ndcg10:.4f} "
         f"(best epoch {res.best_epoch} of {res.epochs_run}, {res.wall_s:.0f}s, {res.tokens_per_s:,.0f} tokens/s, "
         f"{res.matmul_share:.0%} of the matmul rate{', bf16' if res.bf16 else ''}{', cached' if hit else ''})")
