"""The personalization study as two pipeline stages: `train_stage(ctx)` and `evaluate_stage(ctx)`.

For every method in `methods.run` and every seed in `training.seeds`, train one model per learning
rate of `training.lr_grid` (same examples, same steps), keep the one with the best validation
Recall@10, and evaluate it on the test split through the torch engine; the baselines (popularity,
SASRec) are evaluated on the same users. Results go to MLflow: one child run per (method, seed)
under the experiment's parent run, and on the parent the comparison table (CSV artifact) and
plotly figures. The table is printed at the end.

Caching (resume after an interruption; `workbench.cache.cached`): every trained model lives in
`data/cache/train/<key>/` (checkpoint; its TrainResult in done.json, written last), every evaluation in
`data/cache/eval/<key>/`, SASRec in `data/cache/sasrec/<key>/`. Keys hash the config sections a
step reads plus the upstream stage keys, so a changed knob recomputes exactly what depends on it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench import names
from workbench.config import section_hash, settings_from
from workbench.cache import cached, read_done
from workbench.paths import cache_dir

CACHE_FORMAT = 2  # 2: sliding-window SASRec, mask-free right-padded training (older caches are stale)
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


def inputs_from_context(ctx) -> StudyInputs:
    from workbench.sids.embeddings import item_texts
    from workbench.study.prompts import Interactions, UserEncoder

    split = ctx.split
    inter = Interactions(split.train_sequences(), split.valid_items(), split.test_items(), split.n_items)
    enc = UserEncoder(vectors=ctx.user_vectors_as_of, dim=int(ctx.als.factors), codes=ctx.user_quantizer.encode)
    return StudyInputs(
        interactions=inter, item_texts=item_texts(ctx.dataset.items), encoder=enc, item_codes=ctx.item_codes,
        item_codebooks=tuple(ctx.item_codebooks), dedup_size=int(ctx.dedup_size),
        user_codebooks=tuple(ctx.user_codebooks), sid_version=ctx.sid_version, upstream_key=ctx.keys["semantic_ids"],
    )


def _say(msg: str) -> None:
    print(msg, flush=True)


# ---- training -------------------------------------------------------------------------------------


def _train_key(cfg, inp: StudyInputs, method: str, lr: float, seed: int) -> str:
    tr = cfg.training.model_dump(mode="json")
    for k in ("seeds", "lr_grid"):
        tr.pop(k)
    meth = {"recent_k": cfg.methods.recent_k, "long_m": cfg.methods.long_m}
    return section_hash("train", CACHE_FORMAT, cfg.model, tr, meth, method, float(lr), int(seed), inp.upstream_key)


def build_prompt_builder(cfg, backbone, inp: StudyInputs, method: str):
    from workbench.study.prompts import PromptBuilder, tokenize_item_texts

    text_ids = tokenize_item_texts(backbone.tokenizer, inp.item_texts) if method == "text_history" else None
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

    res, _, hit = cached("train", _train_key(cfg, inp, method, lr, seed), compute, load, _say)
    return res, hit


def _train(cfg, inp: StudyInputs, method: str, seed: int, lr: float, folder: Path, log_fn):
    from workbench.study.prompts import eval_examples, length_stats, train_examples
    from workbench.study.train import TrainSettings, train_model

    t = cfg.training
    bb = new_backbone(cfg, inp, seed)
    builder = build_prompt_builder(cfg, bb, inp, method)
    train_set = train_examples(builder, inp.interactions, t.targets_per_user, inp.encoder)
    valid_set = eval_examples(builder, inp.interactions, "valid", inp.encoder, users=valid_users(cfg, inp, seed))
    st = settings_from(TrainSettings, cfg.training, cfg.model, lr=lr, seed=seed)
    _say(f"  training {method} seed={seed} lr={lr:g}: {len(train_set)} examples, "
         f"prompt tokens mean {train_set.lengths().mean():.0f}")
    res = train_model(bb, train_set, valid_set, inp.item_codes, folder, st, sid_version=inp.sid_version,
                      user_dim=inp.encoder.dim if method == "soft_token" else None, log_fn=log_fn)
    res.history.append({"prompt": length_stats(train_set)})
    return res


class _SafeRun:
    """Wraps a run handle so metric names are MLflow-safe (`names.metric_name`)."""

    def __init__(self, run):
        self._run = run

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self._run.log_metrics({names.metric_name(k): v for k, v in metrics.items()}, step)

    def __getattr__(self, name):
        return getattr(self._run, name)


def _child(ctx, name: str, tags: dict):
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


def _threads(cfg) -> None:
    if cfg.training.num_threads:
        import torch

        torch.set_num_threads(int(cfg.training.num_threads))


def train_stage(ctx) -> dict:
    """Train every (method, seed), picking the LR per method on validation; returns {(method, seed): result}."""
    cfg = ctx.cfg
    _threads(cfg)
    inp = inputs_from_context(ctx)
    best: dict[tuple[str, int], Any] = {}
    grid_log: list[dict] = []
    for method in cfg.methods.run:
        for seed in cfg.training.seeds:
            cands = []
            for lr in cfg.training.lr_grid:
                tags = {names.TAG_STAGE: "train", names.TAG_METHOD: method, names.TAG_SEED: seed, names.TAG_LR: lr}
                with _child(ctx, f"train/{method}/seed{seed}/lr{lr:g}", tags) as run:
                    res, hit = train_one(cfg, inp, method, seed, lr, log_fn=run.log_metrics)
                    if hit:
                        for row in res.history:
                            if "epoch" in row:
                                run.log_metrics({names.TRAIN_EPOCH_LOSS: row["train_loss"], names.VALID_RECALL10: row[names.VALID_RECALL10]}, row["step"])
                    run.log_metrics({names.BEST_VALID_RECALL10: res.best_valid_recall10, "train/steps": res.steps,
                                     "train/tokens": res.train_tokens, "train/flops": res.flops, "train/wall_s": res.wall_s})
                    run.set_tags({names.TAG_CACHE_HIT: hit, names.TAG_CHECKPOINT: str(res.checkpoint)})
                cands.append(res)
                grid_log.append({"method": method, "seed": seed, "lr": lr, "valid_recall10": res.best_valid_recall10,
                                 "cached": hit})
                _say(f"  {method} seed={seed} lr={lr:g}: valid Recall@10 {res.best_valid_recall10:.4f} "
                     f"({res.epochs_run} epochs, {res.wall_s:.0f}s{', cached' if hit else ''})")
            best[(method, seed)] = max(cands, key=lambda r: r.best_valid_recall10)
    ctx.run.log_dict(grid_log, "lr_grid.json")
    ctx.products["train"] = best
    return best


# ---- evaluation -----------------------------------------------------------------------------------


def test_users(cfg, inp: StudyInputs) -> np.ndarray:
    n = inp.interactions.n_users
    if cfg.evaluation.test_users is None or cfg.evaluation.test_users >= n:
        return np.arange(n)
    rng = np.random.default_rng(cfg.seed)
    return np.sort(rng.choice(n, size=cfg.evaluation.test_users, replace=False))


def _seen_test(inp: StudyInputs, users) -> list[np.ndarray]:
    d = inp.interactions
    return [np.r_[d.train[u], d.valid[u]].astype(np.int64) for u in users]


def sasrec(cfg, inp: StudyInputs, log_fn=None):
    """SASRec trained (or loaded from cache) on the train split, same max history as the prompts."""
    import torch

    from workbench.study.baselines import SasrecSettings, _build, train_sasrec

    st = SasrecSettings(max_len=cfg.methods.long_m, epochs=cfg.evaluation.sasrec_epochs, seed=cfg.seed)
    key = section_hash("sasrec", CACHE_FORMAT, SASREC_FORMAT, st.__dict__, inp.upstream_key)

    def load(folder: Path, info: dict):
        model = _build(inp.interactions.n_items, st)
        model.load_state_dict(torch.load(folder / "model.pt"))
        return model.eval()

    def compute(folder: Path):
        d = inp.interactions
        res = train_sasrec(d.train, d.valid, d.n_items, st, log_fn=log_fn)
        torch.save(res.model.state_dict(), folder / "model.pt")
        return res.model, {"best_epoch": res.best_epoch, "best_valid_ndcg10": res.best_valid_ndcg10,
                           "wall_s": res.wall_s, "history": res.history}

    model, info, _ = cached("sasrec", key, compute, load, _say)
    return model, st, info


def _eval_key(cfg, train_ckpt: Path, users: np.ndarray, rerank_cands) -> str:
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
                        cfg.methods.long_m, users.tolist(), cands, EVAL_ENGINE, EVAL_MODE, EVAL_DTYPE)


def method_test_prompts(cfg, inp: StudyInputs, method: str, checkpoint: Path, users: np.ndarray):
    """The test prompts of `method` for `users`, tokenized with the checkpoint's own tokenizer and layout
    (what evaluation sends, and what a `prompts_from: test_split` load test replays)."""
    from transformers import AutoTokenizer

    from workbench.model.checkpoint import read_meta
    from workbench.study.prompts import PromptBuilder, eval_examples, tokenize_item_texts

    meta = read_meta(checkpoint)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    max_pos = json.loads((Path(checkpoint) / "config.json").read_text()).get("max_position_embeddings", 2048)
    builder = PromptBuilder(method, meta.layout, meta.layout.item_codes_to_ids(inp.item_codes), cfg.methods.recent_k,
                            cfg.methods.long_m,
                            tokenize_item_texts(tok, inp.item_texts) if method == "text_history" else None,
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
        info = read_done(cache_dir("train", _train_key(cfg, inp, method, lr, seed)))
        if info is not None:
            res = TrainResult.from_dict(info)
            if res.checkpoint.exists():
                found.append(res)
    if len(found) < len(cfg.training.lr_grid):
        raise StudyError(f"{cfg.name}: method {method!r} (seed {seed}) is not trained for every LR of its grid; "
                         f"run `workbench run <the study's YAML> --stages data embeddings semantic_ids train` first")
    return max(found, key=lambda r: r.best_valid_recall10).checkpoint


def study_test_prompts(cfg, checkpoint: Path, inp: StudyInputs):
    """The test prompts of the study `cfg` for a checkpoint it trained (its method, its test users);
    `inp`: `inputs_from_context(prepare_context(cfg))`."""
    from workbench.model.checkpoint import read_meta

    meta = read_meta(checkpoint)
    if meta.sid_version != inp.sid_version:
        raise StudyError(f"{checkpoint} was trained on other Semantic IDs (sid_version {meta.sid_version}) than the "
                         f"study {cfg.name} builds ({inp.sid_version}); point load.study at the YAML that trained it")
    return method_test_prompts(cfg, inp, meta.method, Path(checkpoint), test_users(cfg, inp))


def evaluate_method(cfg, inp: StudyInputs, method: str, res, users: np.ndarray, rerank_cands, progress=True) -> dict:
    """Metrics + per-user arrays of one trained checkpoint on the test users (cached)."""

    def load(folder: Path, metrics: dict):
        z = np.load(folder / "per_user.npz")
        return {"metrics": metrics, "per_user": {k: z[k] for k in z.files if k.startswith("quality/")},
                "rerank_per_user": {k[7:]: z[k] for k in z.files if k.startswith("rerank:")}, "lists": z["lists"]}

    out, _, _ = cached("eval", _eval_key(cfg, res.checkpoint, users, rerank_cands),
                       lambda folder: _evaluate(cfg, inp, method, res, users, rerank_cands, progress, folder), load, _say)
    return out


def _evaluate(cfg, inp: StudyInputs, method: str, res, users, rerank_cands, progress: bool, folder: Path):
    from workbench.study.evaluate import EvalSettings, evaluate_checkpoint
    from workbench.study.prompts import length_stats

    ps = method_test_prompts(cfg, inp, method, res.checkpoint, users)
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
    np.savez(folder / "per_user.npz", lists=lists, **arrays)
    return {"metrics": metrics, "per_user": out["beam"].per_user,
            "rerank_per_user": {} if out["rerank"] is None else out["rerank"].per_user, "lists": lists}, metrics


def eval_tags(method: str, seed: int, checkpoint) -> dict[str, Any]:
    """Tags of one evaluation child run: what was measured, on which checkpoint, engine, mode and dtype."""
    return {names.TAG_STAGE: "evaluate", names.TAG_METHOD: method, names.TAG_SEED: seed,
            names.TAG_CHECKPOINT: str(checkpoint), names.TAG_ENGINE: EVAL_ENGINE, names.TAG_MODE: EVAL_MODE,
            names.TAG_DTYPE: EVAL_DTYPE}


def evaluate_stage(ctx) -> Any:
    """Evaluate every trained (method, seed) and the baselines; log and print the comparison table."""
    import pandas as pd

    from workbench.study.baselines import popularity_rank, sasrec_rank
    from workbench.study.evaluate import Quality, paired_bootstrap
    from workbench.study.summary import format_table, log_study

    cfg = ctx.cfg
    _threads(cfg)
    inp = inputs_from_context(ctx)
    trained = ctx.products["train"]  # the pipeline runs `train` first (DEPENDS); cache hits when unchanged
    users = test_users(cfg, inp)
    d = inp.interactions
    seen = _seen_test(inp, users)
    targets = d.test[users]
    K = max(cfg.evaluation.ks)
    # baselines
    t0 = time.perf_counter()
    pop = Quality.from_lists("popularity", users, targets, popularity_rank(d.train, d.n_items, seen, K),
                             cfg.evaluation.ks, d.n_items)
    with _child(ctx, "baseline/sasrec", {names.TAG_METHOD: "sasrec"}) as run:
        model, st, info = sasrec(cfg, inp, log_fn=run.log_metrics)
        hist = [np.r_[d.train[u], d.valid[u]] for u in users]
        top = sasrec_rank(model, hist, seen, max(K, cfg.evaluation.rerank_top), st.max_len)
        sas = Quality.from_lists("sasrec", users, targets, [t[:K] for t in top], cfg.evaluation.ks, d.n_items)
        run.log_metrics(sas.summary())
    rerank_cands = [t[: cfg.evaluation.rerank_top] for t in top]
    sas_rr = Quality.from_lists("sasrec", users, targets, [t[:10] for t in rerank_cands], (10,))
    _say(f"  baselines done in {time.perf_counter() - t0:.0f}s (SASRec best valid NDCG@10 {info['best_valid_ndcg10']:.4f})")
    rows, per_user = [], {}
    base_rows = [("popularity", pop), ("sasrec", sas)]
    for name, q in base_rows:
        rows.append({"method": name, "seed": cfg.seed, **q.summary()})
        per_user[(name, cfg.seed)] = q.per_user
    r10 = names.recall_at(10)
    n10 = names.ndcg_at(10)
    for (method, seed), res in trained.items():
        tags = eval_tags(method, seed, res.checkpoint)
        with _child(ctx, f"{method}/seed{seed}", tags) as run:
            t0 = time.perf_counter()
            ev = evaluate_method(cfg, inp, method, res, users, rerank_cands)
            m = dict(ev["metrics"])
            per_user[(method, seed)] = ev["per_user"]
            row = {"method": method, "seed": seed, **m, "lr": res.lr, "train/steps": res.steps,
                   "train/examples": res.train_examples, "train/tokens": res.train_tokens, "train/flops": res.flops,
                   "train/wall_s": res.wall_s, "train/epochs": res.epochs_run,
                   names.BEST_VALID_RECALL10: res.best_valid_recall10}
            for ref in ("none", "sasrec", "popularity"):
                if (ref, seed if ref == "none" else cfg.seed) in per_user and ref != method:
                    for metric in (r10, n10):
                        diff, lo, hi = paired_bootstrap(ev["per_user"][metric],
                                                        per_user[(ref, seed if ref == "none" else cfg.seed)][metric],
                                                        cfg.evaluation.bootstrap, cfg.seed)
                        tag = metric.split("/")[1]
                        row[f"diff_vs_{ref}/{tag}"], row[f"diff_vs_{ref}/{tag}_lo"], row[f"diff_vs_{ref}/{tag}_hi"] = diff, lo, hi
            if ev["rerank_per_user"]:
                diff, lo, hi = paired_bootstrap(ev["rerank_per_user"][n10], sas_rr.per_user[n10], cfg.evaluation.bootstrap, cfg.seed)
                tag = n10.split("/")[1]
                row[f"rerank_diff_vs_sasrec/{tag}"], row[f"rerank_diff_vs_sasrec/{tag}_lo"], row[f"rerank_diff_vs_sasrec/{tag}_hi"] = diff, lo, hi
            run.log_params({"lr": res.lr, "checkpoint": str(res.checkpoint), "test_users": len(users)})
            run.log_metrics({k: v for k, v in row.items() if isinstance(v, (int, float)) and k not in ("seed",)})
            for h in res.history:
                if "epoch" in h:
                    run.log_metrics({names.TRAIN_EPOCH_LOSS: h["train_loss"], names.VALID_RECALL10: h[names.VALID_RECALL10]}, h["step"])
            _say(f"  {method} seed={seed}: Recall@10 {m[r10]:.4f} NDCG@10 {m[n10]:.4f} "
                 f"({time.perf_counter() - t0:.0f}s)")
        rows.append(row)
    # popularity vs none, SASRec vs none: same users, so the same paired intervals apply
    for row in rows[:2]:
        if ("none", cfg.seed) in per_user:
            for metric in (r10, n10):
                diff, lo, hi = paired_bootstrap(per_user[(row["method"], cfg.seed)][metric], per_user[("none", cfg.seed)][metric],
                                                cfg.evaluation.bootstrap, cfg.seed)
                tag = metric.split("/")[1]
                row[f"diff_vs_none/{tag}"], row[f"diff_vs_none/{tag}_lo"], row[f"diff_vs_none/{tag}_hi"] = diff, lo, hi
    rows[1][r10.replace("quality/", "rerank/")] = float(sas_rr.per_user[r10].mean())
    rows[1][n10.replace("quality/", "rerank/")] = float(sas_rr.per_user[n10].mean())
    table = pd.DataFrame(rows)
    table.insert(2, "test_users", len(users))
    log_study(ctx, table, trained)
    text = format_table(table, cfg)
    _say(text)
    ctx.products["evaluate"] = table
    return table
