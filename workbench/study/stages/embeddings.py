"""The embeddings stage: item text embeddings (MiniLM, when the item quantizer reads them), ALS on the train
split, and the per-fold ALS models whose user vectors never saw that user (`sids.embeddings.AlsFolds`).

Cached in three entries (`text_embeddings`, `als`, `als_folds`), each keyed by the config it reads and the data
stage's key; the stage's own key chains the three.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from workbench.cache import cached
from workbench.config import StudyConfig, section_hash
from workbench.study.context import StageContext, say

CACHE_FORMAT = 1  # bump to invalidate every cache written by an older layout of this module
SUPPORTED_TEXT_MODELS = ("all-MiniLM-L6-v2",)


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

        text, info, hit = cached("text_embeddings", text_key, compute_text, lambda f, i: np.load(f / "text.npy"), say)
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

    als, info, hit = cached("als", als_key, compute_als, lambda f, i: AlsModel.load(f / "als.npz"), say)
    hits.append(hit)
    stats.update(info["stats"])
    folds_key = section_hash("als_folds", CACHE_FORMAT, emb.als_folds, als_key)

    def compute_folds(folder: Path):
        t0 = time.perf_counter()
        folds = fit_als_folds(ctx.split.train_sequences(), ctx.dataset.n_items, emb.als_folds, emb.als_factors,
                              emb.als_iterations, emb.als_regularization, emb.als_alpha, cfg.seed, reference=als)
        folds.save(folder / "folds")
        return folds, {"stats": {**folds.stats(), "time/compute/als_folds_s": time.perf_counter() - t0}}

    folds, info, hit = cached("als_folds", folds_key, compute_folds, lambda f, i: AlsFolds.load(f / "folds"), say)
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
    say(f"  ALS {als.factors} factors, valid recall@10 {recall:.4f}" + (f"; text {text.shape}" if text is not None else ""))
