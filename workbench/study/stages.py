"""The personalization study's train stage (`train_stage(ctx)`) and the per-model pieces evaluation uses.

For every method in `methods.run` and every seed in `training.seeds`, train one model per learning
rate of `training.lr_grid` on full-sequence windows (`windows.py`: every train transition a target
once per epoch), keep the one with the best validation NDCG@10; one MLflow child run per (method,
seed, lr). `compare.evaluate_stage` then evaluates the picked models and the baselines with the
per-model pieces defined here (`evaluate_method`, `sasrec`, `method_test_prompts`). With `training.workers` > 1,
several models train at a time, each in its own process ("training workers" below).

Caching (resume after an interruption; `workbench.cache.cached`): every trained model lives in
`data/cache/train/<key>/` (checkpoint; its TrainResult in done.json, written last; while it trains,
`resume.pt` holds the state after the last finished epoch, so a stopped run resumes there), every evaluation in
`data/cache/eval/<key>/`, SASRec in `data/cache/sasrec/<key>/`. Keys hash the config sections a
step reads plus the upstream stage keys, so a changed knob recomputes exactly what depends on it.
Under torchrun (`workbench.dist`) rank 0 writes every entry; training and evaluation entries are computed
by all ranks together (`cached(..., collective=True)`), SASRec by rank 0 while the others wait for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from workbench import names
from workbench.config import section_hash, settings_from
from workbench.cache import RESUME_FILE, cached, read_done
from workbench.errors import UsageError
from workbench.paths import cache_dir

CACHE_FORMAT = 3  # 3: full-sequence windows (older caches are stale)
SASREC_FORMAT = 2  # 2: unit-scale embedding init (SASRec with N(0, 1) rows trained below popularity)
# Quality is measured through this engine, in this mode and dtype; the evaluation child runs carry
# them as tags so the report can join quality with load runs of the same checkpoint/engine/mode/dtype.
EVAL_ENGINE = "torch"
EVAL_MODE = "constrained"
EVAL_DTYPE = "float32"


@dataclass
class StudyInputs:
    """What the study needs from the data stages, in plain arrays."""

    interactions: Any  # personalization.Interactions
    item_texts: list[str]
    encoder: Any  # personalization.UserEncoder
    item_codes: np.ndarray  # [n_items, depth]
    item_codebooks: tuple[int, ...]
    dedup_size: int
    user_codebooks: tuple[int, ...]
    sid_version: str
    upstream_key: str  # cache key of the semantic-id stage (chains data + embeddings)
    als: Any = None  # the full-train AlsModel (the `als` baseline ranks with its item factors)


def inputs_from_context(ctx) -> StudyInputs:
    from workbench.sids.embeddings import item_texts
    from workbench.study.prompts import Interactions, UserEncoder

    split = ctx.split
    inter = Interactions(split.train_sequences(), split.valid_items(), split.test_items(), split.n_items)
    enc = UserEncoder(vectors=ctx.user_vectors_as_of, dim=int(ctx.als.factors), codes=ctx.user_quantizer.encode,
                      train_vectors=ctx.als_folds.vectors_as_of)
    return StudyInputs(
        interactions=inter, item_texts=item_texts(ctx.dataset.items), encoder=enc, item_codes=ctx.item_codes,
        item_codebooks=tuple(ctx.item_codebooks), dedup_size=int(ctx.dedup_size),
        user_codebooks=tuple(ctx.user_codebooks), sid_version=ctx.sid_version, upstream_key=ctx.keys["semantic_ids"],
        als=ctx.als,
    )


def _say(msg: str) -> None:
    print(msg, flush=True)


# ---- training -------------------------------------------------------------------------------------


def _train_key(cfg, inp: StudyInputs, method: str, lr: float, seed: int) -> str:
    tr = cfg.training.model_dump(mode="json")
    for k in ("seeds", "lr_grid", "num_threads", "workers", "save_every_s"):  # threads: rounding only; others: none
        tr.pop(k)
    meth = {"recent_k": cfg.methods.recent_k, "long_m": cfg.methods.long_m}
    return section_hash("train", CACHE_FORMAT, cfg.model, tr, meth, method, float(lr), int(seed), inp.upstream_key)


def build_prompt_builder(cfg, backbone, inp: StudyInputs, method: str):
    from workbench.study import methods
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
        res = TrainResult.from_dict(info)
        if not res.checkpoint.exists():
            raise KeyError(f"checkpoint {res.checkpoint} missing")
        return res

    def compute(folder: Path):
        res = _train(cfg, inp, method, seed, lr, folder, log_fn)
        return res, res.to_dict()

    # resumable: training saves its state after every epoch in the entry; an interrupted run goes on from there
    # collective: under torchrun every rank trains (its share of each batch), rank 0 writes the entry
    res, _, hit = cached("train", _train_key(cfg, inp, method, lr, seed), compute, load, _say, resumable=True,
                         collective=True)
    return res, hit


def _train(cfg, inp: StudyInputs, method: str, seed: int, lr: float, folder: Path, log_fn):
    from workbench.study import methods
    from workbench.study.prompts import eval_examples
    from workbench.study.train import TrainSettings, train_model
    from workbench.study.windows import WindowBuilder

    bb = new_backbone(cfg, inp, seed)
    builder = build_prompt_builder(cfg, bb, inp, method)
    wb = WindowBuilder(builder, max_tokens=builder.max_prompt_tokens)
    valid_set = eval_examples(builder, inp.interactions, "valid", inp.encoder, users=valid_users(cfg, inp, seed))
    st = settings_from(TrainSettings, cfg.training, cfg.model, lr=lr, seed=seed)

    def windows(rng):
        ws = wb.epoch(inp.interactions.train, inp.encoder, rng)
        _say(f"  {method} seed={seed} lr={lr:g}: {len(ws)} windows, {ws.n_targets} item targets, "
             f"{int(ws.lengths().sum())} tokens (mean window {ws.lengths().mean():.0f})")
        return ws

    return train_model(bb, windows, valid_set, inp.item_codes, folder, st, sid_version=inp.sid_version,
                       user_dim=inp.encoder.dim if methods.get(method).signal == methods.VECTOR else None,
                       log_fn=log_fn)


class _SafeRun:
    """Wraps a run handle so metric names are MLflow-safe (`names.metric_name`)."""

    def __init__(self, run):
        self._run = run

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self._run.log_metrics({names.metric_name(k): v for k, v in metrics.items()}, step)

    def __getattr__(self, name):
        return getattr(self._run, name)


def child_run(ctx, name: str, tags: dict):
    import contextlib

    from workbench import tracking

    if ctx.parent is None:
        from workbench.study.context import NullRun

        return contextlib.nullcontext(NullRun())

    @contextlib.contextmanager
    def wrapped():
        with tracking.start_run(name, parent=ctx.parent, tags=tags) as run:
            yield _SafeRun(run)

    return wrapped()


def use_threads(cfg) -> None:
    """`training.num_threads` for torch and for numpy's BLAS alike (when set)."""
    if cfg.training.num_threads:
        set_threads(int(cfg.training.num_threads))


def set_threads(n: int) -> None:
    """n threads for torch and for numpy's BLAS, for the rest of the process. The BLAS matters too: the user signal
    of every training window is folded in with numpy each epoch, and a BLAS left at one thread per core spins
    on a core another process is training on (seen: one epoch's fold-ins of soft_token on ML-1M took over
    17 minutes with two study processes per core instead of seconds)."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    threadpool_limits(n, user_api="blas")


def train_stage(ctx, build_inputs: Callable[[Any], StudyInputs] | None = None) -> dict:
    """Train every (method, seed), picking the LR per method on validation; returns {(method, seed): result}.

    One MLflow child run per (method, seed, lr). With `training.workers` > 1 the models not in the cache yet train
    in that many processes at a time ("training workers" below), and each one's run is logged here when it
    finishes; `build_inputs(cfg)` (a module-level function: the runner's) rebuilds the StudyInputs in a worker."""
    from workbench import dist

    cfg = ctx.cfg
    use_threads(cfg)
    inp = inputs_from_context(ctx)
    jobs = [(m, s, lr) for m in cfg.methods.run for s in cfg.training.seeds for lr in cfg.training.lr_grid]
    done: dict[tuple, tuple[Any, bool]] = {}  # job -> (TrainResult, cache hit)
    todo = [job for job in jobs if _train_entry(cfg, inp, *job)[1] is None]
    if cfg.training.workers > 1 and len(todo) > 1:
        if dist.world().size > 1:
            raise UsageError("training.workers > 1 does not combine with torchrun (every rank already trains its "
                             "share of each model); set training.workers: 1")
        if build_inputs is None:
            raise ValueError("training.workers > 1: train_stage needs build_inputs (pipeline.study_inputs)")
        from workbench.study.workers import side_by_side

        n = min(cfg.training.workers, len(todo))
        _say(f"  training {len(todo)} models, {n} at a time in worker processes ({threads_per_worker(cfg)} "
             f"thread(s) each); each model's run is logged when it finishes")

        def finished(job, fut) -> None:
            with _train_run(ctx, *job) as run:
                logged = _worker_result(job, fut)
                res = _trained_by_worker(cfg, inp, *job)
                for metrics, step in logged:
                    run.log_metrics(metrics, step)
                _log_train(run, res, hit=False)
            done[job] = (res, False)
            _say_trained(job, res, hit=False)

        side_by_side(todo, n, _worker_train, finished, init=_worker_init,
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
    for method, seed, lr in jobs:  # the grid's order, whatever order the models finished in
        res = done[(method, seed, lr)][0]
        if (method, seed) not in best or res.best_valid_ndcg10 > best[(method, seed)].best_valid_ndcg10:
            best[(method, seed)] = res
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
    """Train one (method, seed, lr) in this worker; returns the metrics it logged, as (metrics, step) in order."""
    logged: list[tuple[dict, int]] = []
    train_one(_worker["cfg"], _worker["inputs"], *job, log_fn=lambda m, step: logged.append((dict(m), step)))
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
        raise RuntimeError(f"the worker process training {job[0]} seed={job[1]} lr={job[2]:g} died (killed, out of "
                           "memory, or its start failed: its output is above); what finished is cached, run the "
                           "study again to resume") from e


def _train_entry(cfg, inp: StudyInputs, method: str, seed: int, lr: float) -> tuple[Path, dict | None]:
    """A model's cache folder and its stored info (None until the model is complete)."""
    folder = cache_dir("train", _train_key(cfg, inp, method, lr, seed))
    return folder, read_done(folder)


def _trained_by_worker(cfg, inp: StudyInputs, method: str, seed: int, lr: float):
    """The TrainResult a worker stored for this model (read, never trained here: a missing entry is a bug)."""
    from workbench.study.train import TrainResult

    folder, info = _train_entry(cfg, inp, method, seed, lr)
    if info is None:
        raise RuntimeError(f"the worker that trained {method} seed={seed} lr={lr:g} left no complete entry in {folder}")
    return TrainResult.from_dict(info)


def _log_train(run, res, hit: bool) -> None:
    run.log_metrics({names.BEST_VALID_NDCG10: res.best_valid_ndcg10,
                     names.BEST_VALID_RECALL10: res.best_valid_recall10, "train/steps": res.steps,
                     "train/tokens": res.train_tokens, names.TRAIN_FLOPS: res.flops,
                     "train/wall_s": res.wall_s, names.TRAIN_TOKENS_PER_S: res.tokens_per_s,
                     names.TRAIN_MATMUL_SHARE: res.matmul_share, "train/bf16": float(res.bf16)})
    run.set_tags({names.TAG_CACHE_HIT: hit, names.TAG_CHECKPOINT: str(res.checkpoint)})


def _say_trained(job, res, hit: bool) -> None:
    method, seed, lr = job
    _say(f"  {method} seed={seed} lr={lr:g}: valid NDCG@10 {res.best_valid_ndcg10:.4f} "
         f"({res.epochs_run} epochs, {res.wall_s:.0f}s, {res.tokens_per_s:,.0f} tokens/s, "
         f"{res.matmul_share:.0%} of the matmul rate{', bf16' if res.bf16 else ''}{', cached' if hit else ''})")


# ---- evaluation -----------------------------------------------------------------------------------


def test_users(cfg, inp: StudyInputs) -> np.ndarray:
    n = inp.interactions.n_users
    if cfg.evaluation.test_users is None or cfg.evaluation.test_users >= n:
        return np.arange(n)
    rng = np.random.default_rng(cfg.seed)
    return np.sort(rng.choice(n, size=cfg.evaluation.test_users, replace=False))


def seen_items(inp: StudyInputs, users) -> list[np.ndarray]:
    d = inp.interactions
    return [np.r_[d.train[u], d.valid[u]].astype(np.int64) for u in users]


def sasrec(cfg, inp: StudyInputs, seed: int, log_fn=None):
    """SASRec for one training seed (trained or loaded from cache), its LR picked on validation NDCG@10
    from `evaluation.sasrec_lr_grid`, like the generative models'. Returns (model, settings, info)."""
    import torch

    from workbench.study.baselines import SasrecSettings, build_sasrec, train_sasrec

    ev = cfg.evaluation
    best = None
    for lr in ev.sasrec_lr_grid:
        st = SasrecSettings(max_len=ev.sasrec_max_len or cfg.methods.long_m, epochs=ev.sasrec_epochs, seed=seed, lr=lr)
        key = section_hash("sasrec", CACHE_FORMAT, SASREC_FORMAT, st.__dict__, inp.upstream_key)

        def load(folder: Path, info: dict, st=st):
            model = build_sasrec(inp.interactions.n_items, st)
            model.load_state_dict(torch.load(folder / "model.pt"))
            return model.eval()

        def compute(folder: Path, st=st):
            d = inp.interactions
            res = train_sasrec(d.train, d.valid, d.n_items, st, log_fn=log_fn, resume_file=folder / RESUME_FILE)
            torch.save(res.model.state_dict(), folder / "model.pt")
            (folder / RESUME_FILE).unlink(missing_ok=True)  # model.pt holds what matters now
            return res.model, {"best_epoch": res.best_epoch, "best_valid_ndcg10": res.best_valid_ndcg10,
                               "wall_s": res.wall_s, "history": res.history, "lr": lr}

        # resumable: a stopped SASRec goes on after its last finished epoch
        model, info, _ = cached("sasrec", key, compute, load, _say, resumable=True)
        if best is None or info["best_valid_ndcg10"] > best[2]["best_valid_ndcg10"]:
            best = (model, st, info)
    return best


def _eval_key(cfg, train_ckpt: Path, users: np.ndarray, rerank_cands, variant: str = "own") -> str:
    """Hashes everything an evaluation reads, including the re-rank candidates themselves (they come
    from SASRec, whose own cache key is not part of the checkpoint's: a retrained SASRec must not reuse
    a re-rank result computed on another SASRec's top-100)."""
    import hashlib

    cands = "none"
    if rerank_cands is not None:
        h = hashlib.sha1()
        for c in rerank_cands:
            h.update(np.asarray(c, dtype=np.int64).tobytes() + b"|")
        cands = h.hexdigest()
    return section_hash("eval", CACHE_FORMAT, cfg.evaluation, str(train_ckpt), cfg.methods.recent_k,
                        cfg.methods.long_m, users.tolist(), cands, EVAL_ENGINE, EVAL_MODE, EVAL_DTYPE, variant)


def method_test_prompts(cfg, inp: StudyInputs, method: str, checkpoint: Path, users: np.ndarray):
    """The test prompts of `method` for `users`, tokenized with the checkpoint's own tokenizer and layout
    (what evaluation sends, and what a `prompts_from: test_split` load test replays)."""
    from transformers import AutoTokenizer

    from workbench.model.checkpoint import read_meta
    from workbench.study import methods
    from workbench.study.prompts import PromptBuilder, eval_examples, tokenize_item_texts

    meta = read_meta(checkpoint)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    max_pos = json.loads((Path(checkpoint) / "config.json").read_text()).get("max_position_embeddings", 2048)
    builder = PromptBuilder(method, meta.layout, meta.layout.item_codes_to_ids(inp.item_codes), cfg.methods.recent_k,
                            cfg.methods.long_m,
                            tokenize_item_texts(tok, inp.item_texts) if methods.get(method).needs_text else None,
                            max_prompt_tokens=max_pos - meta.layout.item_depth)  # fmt: skip
    return eval_examples(builder, inp.interactions, "test", inp.encoder, users=users)


class StudyError(ValueError):
    """A load test asked for a study's checkpoints or prompts that the study has not produced."""


def trained_checkpoint(cfg, inp: StudyInputs, method: str, seed: int | None = None) -> Path:
    """The checkpoint `workbench run` trained for `method` (seed: the first of training.seeds; the LR of the
    grid with the best validation Recall@10, as the train stage picks it). Never trains: says how to."""
    from workbench.study.train import TrainResult

    seed = cfg.training.seeds[0] if seed is None else seed
    found = []
    for lr in cfg.training.lr_grid:
        info = _train_entry(cfg, inp, method, seed, lr)[1]
        if info is not None:
            res = TrainResult.from_dict(info)
            if res.checkpoint.exists():
                found.append(res)
    if len(found) < len(cfg.training.lr_grid):
        raise StudyError(f"{cfg.name}: method {method!r} (seed {seed}) is not trained for every LR of its grid; "
                         f"run `workbench run <the study's YAML> --stages data embeddings semantic_ids train` first")
    return max(found, key=lambda r: r.best_valid_ndcg10).checkpoint


def study_test_prompts(cfg, checkpoint: Path, inp: StudyInputs):
    """The test prompts of the study `cfg` for a checkpoint it trained (its method, its test users);
    `inp`: `inputs_from_context(prepare_context(cfg))`."""
    from workbench.model.checkpoint import read_meta

    meta = read_meta(checkpoint)
    if meta.sid_version != inp.sid_version:
        raise StudyError(f"{checkpoint} was trained on other Semantic IDs (sid_version {meta.sid_version}) than the "
                         f"study {cfg.name} builds ({inp.sid_version}); point load.study at the YAML that trained it")
    return method_test_prompts(cfg, inp, meta.method, Path(checkpoint), test_users(cfg, inp))


def evaluate_method(cfg, inp: StudyInputs, method: str, res, users: np.ndarray, rerank_cands, progress=True,
                    variant: str = "own") -> dict:
    """Metrics + per-user arrays of one trained checkpoint on the test users (cached); `variant`
    replaces the user signal ("shuffled" | "zeroed", `PromptSet.with_signal`) to measure what it carries."""

    def load(folder: Path, metrics: dict):
        z = np.load(folder / "per_user.npz")
        return {"metrics": metrics, "per_user": {k: z[k] for k in z.files if k.startswith("quality/")},
                "rerank_per_user": {k[7:]: z[k] for k in z.files if k.startswith("rerank:")}, "lists": z["lists"]}

    out, _, _ = cached("eval", _eval_key(cfg, res.checkpoint, users, rerank_cands, variant),
                       lambda folder: _evaluate(cfg, inp, method, res, users, rerank_cands, progress, folder, variant),
                       load, _say, collective=True)  # under torchrun every rank beams its share of the users
    return out


def _evaluate(cfg, inp: StudyInputs, method: str, res, users, rerank_cands, progress: bool, folder: Path,
              variant: str = "own"):
    from workbench import dist
    from workbench.study.evaluate import EvalSettings, evaluate_checkpoint
    from workbench.study.prompts import length_stats

    ps = method_test_prompts(cfg, inp, method, res.checkpoint, users)
    if variant != "own":
        from workbench.model.checkpoint import read_meta

        lay = read_meta(res.checkpoint).layout
        zero = lay.user_codes_to_ids(np.zeros((1, len(lay.user_codebooks)), dtype=np.int64))[0].tolist() \
            if lay.user_codebooks else None
        ps = ps.with_signal(variant, cfg.seed, zero)
    ev = cfg.evaluation
    settings = settings_from(EvalSettings, ev, progress=progress)
    out = evaluate_checkpoint(res.checkpoint, ps, settings, rerank_candidates=rerank_cands, engine_name=EVAL_ENGINE,
                              dtype=EVAL_DTYPE)
    metrics = {**out["metrics"], **length_stats(ps)}
    arrays = {k: v for k, v in out["beam"].per_user.items()}
    if out["rerank"] is not None:
        arrays.update({f"rerank:{k}": v for k, v in out["rerank"].per_user.items()})
    lists = np.full((len(users), max(ev.ks)), -1, dtype=np.int64)
    for i, l in enumerate(out["beam"].lists):
        lists[i, : len(l)] = l[: max(ev.ks)]
    if dist.is_main():  # the other ranks hold the same (gathered) arrays
        np.savez(folder / "per_user.npz", lists=lists, **arrays)
    return {"metrics": metrics, "per_user": out["beam"].per_user,
            "rerank_per_user": {} if out["rerank"] is None else out["rerank"].per_user, "lists": lists}, metrics


def eval_tags(method: str, seed: int, checkpoint) -> dict[str, Any]:
    """Tags of one evaluation child run: what was measured, on which checkpoint, engine, mode and dtype."""
    return {names.TAG_STAGE: "evaluate", names.TAG_METHOD: method, names.TAG_SEED: seed,
            names.TAG_CHECKPOINT: str(checkpoint), names.TAG_ENGINE: EVAL_ENGINE, names.TAG_MODE: EVAL_MODE,
            names.TAG_DTYPE: EVAL_DTYPE}
