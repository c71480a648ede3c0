"""What the train and evaluate stages share, below them both: the study's inputs in plain arrays, where a trained
model's cache entry lives, the test users and their prompts, and the thread count.

A study's readers (a load test's `trained:<method>` checkpoints and `prompts_from: test_split`) reach these through
`outputs.py`, the study's public face, never here directly.

Caching: every trained model lives in `data/cache/train/<key>/` (`train_entry`); the key hashes the config sections
training reads plus the semantic-IDs stage's key (which chains data and embeddings).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench import names
from workbench.cache import read_done
from workbench.config import section_hash
from workbench.paths import cache_dir
from workbench.study import methods

CACHE_FORMAT = 3  # 3: full-sequence windows (older caches are stale)


@dataclass
class StudyInputs:
    """What the study needs from the data stages, in plain arrays."""

    interactions: Any  # prompts.Interactions
    item_texts: list[str]
    encoder: Any  # prompts.UserEncoder
    item_codes: np.ndarray  # [n_items, depth]
    item_codebooks: tuple[int, ...]
    dedup_size: int
    user_codebooks: tuple[int, ...]
    sid_version: str
    upstream_key: str  # cache key of the semantic-id stage (chains data + embeddings)
    als: Any = None  # the full-train AlsModel (the `als` baseline ranks with its item factors)
    # what the dataset supplies about users (None where it supplies nothing), for the user-signal sources:
    user_features: Any = None  # pandas DataFrame, row u = user u: `user` + one column per feature
    user_embeddings: Any = None  # data.user_embeddings.UserEmbeddings: `.before(users, last_ts)` honours `as_of`
    signal_key: str | None = None  # the user signal's key (study/user_signal.py): in the readers' train keys only


def inputs_from_context(ctx) -> StudyInputs:
    from workbench.sids.embeddings import item_texts
    from workbench.study.prompts import Interactions

    split = ctx.split
    inter = Interactions(split.train_sequences(), split.valid_items(), split.test_items(), split.n_items,
                         split.train_times(), split.valid_times(), split.test_times())
    return StudyInputs(
        interactions=inter, item_texts=item_texts(ctx.dataset.items), encoder=ctx.user_signal, item_codes=ctx.item_codes,
        item_codebooks=tuple(ctx.item_codebooks), dedup_size=int(ctx.dedup_size),
        user_codebooks=tuple(ctx.user_codebooks), sid_version=ctx.sid_version, upstream_key=ctx.keys["semantic_ids"],
        als=ctx.als, user_features=ctx.dataset.user_features, user_embeddings=_user_embeddings(ctx.dataset),
        signal_key=ctx.keys.get("user_signal"),
    )


def _user_embeddings(dataset):
    """The dataset's user-embedding table as the lookup that applies the `as_of` rule, or None."""
    from workbench.data.user_embeddings import UserEmbeddings

    if dataset.user_embeddings is None:
        return None
    return UserEmbeddings.from_table(dataset.user_embeddings, dataset.n_users)


def train_key(cfg, inp: StudyInputs, method: str, lr: float, seed: int) -> str:
    """One trained model's cache key: the model and training config (not the seed and LR lists, threads, workers or
    save interval), the methods' window sizes, this method, LR and seed, and the semantic-IDs stage's key; for a
    method that reads a user signal, the signal's key too (so a method without one, such as `none`, is trained once
    for every `user_signal` source). A context variant (`none-k5`) has its method's key with its context added: the
    two differ by nothing else (and one at its method's own context is the method: `methods.canonical`)."""
    tr = cfg.training.model_dump(mode="json")
    for k in ("seeds", "lr_grid", "num_threads", "workers", "save_every_s"):  # threads: rounding only; others: none
        tr.pop(k)
    meth = {"recent_k": cfg.methods.recent_k, "long_m": cfg.methods.long_m}
    base, items = names.split_context_variant(methods.canonical(method, cfg.methods.recent_k, cfg.methods.long_m))
    parts = [cfg.model, tr, meth, base, float(lr), int(seed), inp.upstream_key]
    if items is not None:
        parts.append({"context": items})
    if methods.get(method).reads_signal:
        parts.append(inp.signal_key)
    return section_hash("train", CACHE_FORMAT, *parts)


def train_entry(cfg, inp: StudyInputs, method: str, seed: int, lr: float) -> tuple[Path, dict | None]:
    """A model's cache folder and its stored info (None until the model is complete)."""
    folder = cache_dir("train", train_key(cfg, inp, method, lr, seed))
    return folder, read_done(folder)


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


def test_users(cfg, inp: StudyInputs) -> np.ndarray:
    n = inp.interactions.n_users
    if cfg.evaluation.test_users is None or cfg.evaluation.test_users >= n:
        return np.arange(n)
    rng = np.random.default_rng(cfg.seed)
    return np.sort(rng.choice(n, size=cfg.evaluation.test_users, replace=False))


def seen_items(inp: StudyInputs, users) -> list[np.ndarray]:
    d = inp.interactions
    return [np.r_[d.train[u], d.valid[u]].astype(np.int64) for u in users]


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
                            tokenize_item_texts(tok, inp.item_texts) if methods.get(method).needs_text else None,
                            max_prompt_tokens=max_pos - meta.layout.item_depth)  # fmt: skip
    return eval_examples(builder, inp.interactions, "test", inp.encoder, users=users)


class StudyError(ValueError):
    """A load test asked for a study's checkpoints or prompts that the study has not produced."""


def trained_checkpoint(cfg, inp: StudyInputs, method: str, seed: int | None = None) -> Path:
    """The checkpoint `workbench run` trained for `method` (seed: the first of training.seeds; the LR of the
    grid with the best validation NDCG@10, as the train stage picks it). Never trains: says how to."""
    from workbench.study.train import TrainResult

    seed = cfg.training.seeds[0] if seed is None else seed
    found = []
    for lr in cfg.training.lr_grid:
        folder, info = train_entry(cfg, inp, method, seed, lr)
        if info is not None:
            res = TrainResult.from_entry(folder, info)
            if res.checkpoint.exists():
                found.append(res)
    if len(found) < len(cfg.training.lr_grid):
        raise StudyError(f"{cfg.name}: method {method!r} (seed {seed}) is not trained for every LR of its grid; "
                         "run `workbench run <the study's YAML> --stages data embeddings semantic_ids train "
                         f"--seeds {seed}` first")
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
