"""The user signal soft_token and user_sid read, from one configurable source (`user_signal.source`).

soft_token projects a user vector into its `<|user|>` position; user_sid writes the user quantizer's codes of that
vector as tokens. Where the vector comes from is the source; each one gives the `prompts.UserEncoder` what it needs:
a vector per evaluation prompt (as of that prompt), one per training-window cut, its dimension, and the user
quantizer fitted on its own vectors (each user as of their whole train sequence).

- `als`: the user's interactions folded into ALS (`sids.embeddings`). Training windows fold in against the fold
  model that never saw the user (`AlsFolds`). `als_test_vectors: folds` (the default) takes the validation and test
  vectors from that same fold model, so training and test vectors come from the same kind of model; `full` takes
  them from the full-train ALS, which was fitted on the user's own train interactions (the earlier behaviour, a
  train/test mismatch), with the semantic-IDs stage's user quantizer.
- `features`: the dataset's user features (ML-100K / ML-1M: age, gender, occupation, zip code). A categorical
  feature is one-hot over its `max_categories` most frequent values plus an "other" and an "unknown" column (the
  soft token's linear projection of a one-hot is an embedding lookup: one learned row per value); a numeric one is
  standardized with the mean and deviation over the train users, plus an "unknown" flag. Static: they are assumed
  known before any prompt (asked at sign-up), so no interaction can leak into them, and every window and prompt of
  a user reads the same vector.
- `embeddings`: the dataset's user-embedding table through `UserEmbeddings.before` (the data layer's as_of rule:
  the latest vector strictly before a timestamp). The timestamp is that of the last interaction the vector may
  read: a prompt's last shown interaction with `history: all`, the last one before the shown items with `older`;
  a training window's, the interaction just before its cut. Nothing to read (an empty history): the zero vector.
  A table without as_of is one static vector per user, and the run is marked "may include the test period".
- `sasrec`: the user state (the last position's hidden state) of a SASRec (`baselines.build_sasrec` /
  `train_sasrec`, the study's own SASRec settings) over the interactions before the prompt, cross-fitted like the
  ALS folds: K fold models, fold k trained (and early-stopped) on the sequences of the users not in fold k; every
  vector of user u, training windows and test prompts alike, comes from the fold model that never saw u.

`user_signal.history` (`prompts.signal_cut`): `older` (the default) computes a prompt's vector from the history
before the items the prompt shows, `all` from the whole history before the prompt (what a production
recommender's vector would have seen); a training window reads seq[:start] or seq[:start + 1]
(`prompts.window_signal_cut`), never one of its own targets.

Caching: the SASRec fold models in `data/cache/sasrec_folds/<key>/` (resumable: a finished fold is kept, the fold in
training goes on after its last epoch), the user quantizer of a source in `data/cache/user_signal/<key>/`. The
source's key (`ctx.keys["user_signal"]`) enters the train key of the methods that read a signal only
(`inputs.train_key`): none / none_long / text_history keep theirs when only the source changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from workbench.config import section_hash
from workbench.errors import UsageError
from workbench.study import methods

CACHE_FORMAT = 1  # bump to invalidate every entry an older layout of this module wrote
SOURCES = ("als", "features", "embeddings", "sasrec")


class SignalSourceError(UsageError, ValueError):
    """A user-signal source the dataset cannot feed (no user features, no user-embedding table)."""


def _by_fold(fold_of_user: np.ndarray, users, lists, dim: int, vectors_of) -> np.ndarray:
    """[n, dim]: each user's vector from its own fold's model, `vectors_of(fold, lists of that fold's users)`."""
    users = np.asarray(users, dtype=np.int64)
    if len(users) and (users.min() < 0 or users.max() >= len(fold_of_user)):
        raise ValueError("a cross-fitted user-signal source needs each prompt's user id (0..n_users-1)")
    out = np.zeros((len(users), dim), dtype=np.float32)
    folds = fold_of_user[users]
    for k in np.unique(folds):
        idx = np.flatnonzero(folds == k)
        out[idx] = vectors_of(int(k), [lists[i] for i in idx])
    return out


# ---- als ------------------------------------------------------------------------------------------
@dataclass
class AlsSource:
    """ALS fold-in; `test`: "folds" (validation / test vectors from the fold model that never saw the user) or
    "full" (from the full-train ALS)."""

    als: Any  # sids.embeddings.AlsModel, fitted on every train interaction
    folds: Any  # sids.embeddings.AlsFolds
    test: str = "folds"

    @property
    def dim(self) -> int:
        return int(self.als.factors)

    def vectors(self, users, lists, as_of=None) -> np.ndarray:
        from workbench.sids.embeddings import fold_in_users

        if self.test == "full":
            return fold_in_users(self.als, lists)
        return _by_fold(self.folds.fold_of_user, users, lists, self.dim,
                        lambda k, ls: fold_in_users(self.folds.models[k], ls))

    def train_vectors(self, user: int, seq: np.ndarray, cuts: np.ndarray) -> np.ndarray:
        return self.folds.vectors_as_of(user, seq, cuts)


# ---- features -------------------------------------------------------------------------------------
OTHER, UNKNOWN = "other", "unknown"


@dataclass
class FeatureEncoding:
    """How a user-features table becomes one vector per user (module docstring: `features`).

    `columns`: per feature, ("categorical", kept values) — one-hot over the kept values, then OTHER, then UNKNOWN —
    or ("numeric", (mean, std)) — the standardized value (0 where unknown), then an UNKNOWN flag."""

    features: tuple[str, ...]
    columns: tuple[tuple[str, tuple], ...]

    @classmethod
    def fit(cls, table, max_categories: int, fit_users: np.ndarray | None = None) -> "FeatureEncoding":
        """Kept values (the `max_categories` most frequent; ties: the smaller value first) and the numeric
        mean and deviation over the rows of `fit_users` (default every row: the train users)."""
        import pandas as pd

        from workbench import names

        rows = table if fit_users is None else table.iloc[np.asarray(fit_users, dtype=np.int64)]
        feats, cols = [], []
        for f in (c for c in table.columns if c != names.USER):
            col = rows[f]
            if pd.api.types.is_numeric_dtype(table[f]):
                v = col.to_numpy(np.float64)
                v = v[np.isfinite(v)]
                mean = float(v.mean()) if len(v) else 0.0
                std = float(v.std()) if len(v) else 0.0
                cols.append(("numeric", (mean, std if std > 0 else 1.0)))
            else:
                counts = col.dropna().astype(str).value_counts()
                ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                cols.append(("categorical", tuple(v for v, _ in ranked[:max_categories])))
            feats.append(f)
        if not feats:
            raise SignalSourceError("user_signal.source: features found no feature column in the user features")
        return cls(tuple(feats), tuple(cols))

    @property
    def column_names(self) -> list[str]:
        out = []
        for f, (kind, spec) in zip(self.features, self.columns):
            if kind == "categorical":
                out += [f"{f}={v}" for v in spec] + [f"{f}={OTHER}", f"{f}={UNKNOWN}"]
            else:
                out += [f, f"{f}={UNKNOWN}"]
        return out

    @property
    def dim(self) -> int:
        return len(self.column_names)

    def transform(self, table) -> np.ndarray:
        """[rows, dim] float32."""
        import pandas as pd

        blocks = []
        for f, (kind, spec) in zip(self.features, self.columns):
            col = table[f]
            if kind == "numeric":
                v = col.to_numpy(np.float64)
                known = np.isfinite(v)
                z = np.where(known, (np.where(known, v, 0.0) - spec[0]) / spec[1], 0.0)
                blocks.append(np.stack([z, (~known).astype(np.float64)], 1))
            else:
                at = {v: i for i, v in enumerate(spec)}
                idx = np.array([len(spec) + 1 if pd.isna(v) else at.get(str(v), len(spec)) for v in col], dtype=np.int64)
                blocks.append(np.eye(len(spec) + 2)[idx])
        return np.concatenate(blocks, 1).astype(np.float32)


@dataclass
class FeatureSource:
    """The one static vector of each user (`FeatureEncoding`)."""

    matrix: np.ndarray  # [n_users, dim]
    encoding: FeatureEncoding | None = None

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])

    def _rows(self, users) -> np.ndarray:
        users = np.asarray(users, dtype=np.int64)
        if len(users) and (users.min() < 0 or users.max() >= len(self.matrix)):
            raise ValueError("the features source needs each prompt's user id (0..n_users-1)")
        return self.matrix[users]

    def vectors(self, users, lists=None, as_of=None) -> np.ndarray:
        return self._rows(users).copy()

    def train_vectors(self, user: int, seq: np.ndarray, cuts: np.ndarray) -> np.ndarray:
        return np.repeat(self._rows([user]), len(cuts), axis=0)


# ---- embeddings -----------------------------------------------------------------------------------
@dataclass
class EmbeddingSource:
    """The dataset's user-embedding table, as of the last interaction a vector may read (module docstring)."""

    table: Any  # data.user_embeddings.UserEmbeddings
    train_times: list[np.ndarray]  # per user, the timestamps of the train sequence

    @property
    def dim(self) -> int:
        return int(self.table.dim)

    def vectors(self, users, lists=None, as_of=None) -> np.ndarray:
        users = np.asarray(users, dtype=np.int64)
        as_of = np.asarray(as_of, dtype=np.int64)
        if len(users) and (users.min() < 0 or users.max() >= self.table.n_users):
            raise ValueError("the embeddings source needs each prompt's user id (0..n_users-1)")
        out = self.table.before(users, as_of)
        if self.table.as_of is not None:
            out[as_of < 0] = 0.0  # nothing to read before: the zero vector
        return out

    def train_vectors(self, user: int, seq: np.ndarray, cuts: np.ndarray) -> np.ndarray:
        times = self.train_times[user]
        if len(times) != len(seq):
            raise ValueError(f"the embeddings source reads the timestamps of user {user}'s train sequence "
                             f"({len(times)} of them), but was given a sequence of {len(seq)} items")
        cuts = np.asarray(cuts, dtype=np.int64)
        as_of = np.where(cuts > 0, times[np.maximum(cuts - 1, 0)], -1)
        return self.vectors(np.full(len(cuts), user), None, as_of)


# ---- sasrec ---------------------------------------------------------------------------------------
@dataclass
class SasrecFolds:
    """K SASRec models, fold k trained without any fold-k user (`trained_users[k]`: whose sequences it saw, in
    training or its early stopping's validation)."""

    fold_of_user: np.ndarray  # [n_users]
    models: list  # torch modules, eval mode
    trained_users: np.ndarray  # [n_folds, n_users] bool
    max_len: int
    hidden: int

    @property
    def n_folds(self) -> int:
        return len(self.models)

    def model_for(self, user: int):
        return self.models[int(self.fold_of_user[user])]

    def _states(self, model, lists) -> np.ndarray:
        from workbench.study.baselines import sasrec_states

        out = np.zeros((len(lists), self.hidden), dtype=np.float32)
        full = [i for i, s in enumerate(lists) if len(s)]  # an empty history: the zero vector, as ALS gives
        if full:
            out[full] = sasrec_states(model, [lists[i] for i in full], self.max_len)
        return out

    @property
    def dim(self) -> int:
        return self.hidden

    def vectors(self, users, lists, as_of=None) -> np.ndarray:
        return _by_fold(self.fold_of_user, users, lists, self.hidden, lambda k, ls: self._states(self.models[k], ls))

    def train_vectors(self, user: int, seq: np.ndarray, cuts: np.ndarray) -> np.ndarray:
        seq = np.asarray(seq, dtype=np.int64)
        return self._states(self.model_for(user), [seq[: int(c)] for c in cuts])


def fit_sasrec_folds(train: Sequence[np.ndarray], valid: np.ndarray, n_items: int, n_folds: int, settings,
                     seed: int, folder: Path | None = None, say=print) -> SasrecFolds:
    """Cross-fitted SASRec: fold k (seed + 1 + k) trained on the train sequences of the users not in fold k, early
    stopped on those users' valid items (`baselines.train_sasrec`). With `folder`, each finished fold is stored
    there and found again by a later call, and the fold in training resumes after its last finished epoch."""
    import dataclasses

    import torch

    from workbench.sids.embeddings import assign_folds
    from workbench.study.baselines import build_sasrec, train_sasrec

    fold_of_user = assign_folds(len(train), n_folds, seed)
    empty = np.zeros(0, dtype=np.int64)
    models, trained = [], []
    for k in range(n_folds):
        held_out = fold_of_user == k
        seqs = [empty if held_out[u] else np.asarray(s, dtype=np.int64) for u, s in enumerate(train)]
        val = np.where(held_out, -1, np.asarray(valid, dtype=np.int64))
        trained.append(np.array([len(s) > 0 for s in seqs]) | (val >= 0))
        st = dataclasses.replace(settings, seed=seed + 1 + k, progress=False)
        done = None if folder is None else Path(folder) / f"fold_{k}.pt"
        if done is not None and done.exists():
            model = build_sasrec(n_items, st)
            model.load_state_dict(torch.load(done))
            say(f"  SASRec user-signal fold {k + 1}/{n_folds}: stored, reused")
        else:
            say(f"  SASRec user-signal fold {k + 1}/{n_folds}: training on {int((~held_out).sum())} users "
                f"(up to {st.epochs} epochs)")

            def line(metrics: dict, epoch: int, k=k):
                say(f"    fold {k + 1}/{n_folds} epoch {epoch + 1}: loss {metrics['sasrec/train_loss']:.4f}, "
                    f"valid NDCG@10 {metrics['sasrec/valid_ndcg@10']:.4f}")

            resume = None if folder is None else Path(folder) / f"fold_{k}_resume.pt"
            res = train_sasrec(seqs, val, n_items, st, log_fn=line, resume_file=resume)
            model = res.model
            if done is not None:
                torch.save(model.state_dict(), done)
                resume.unlink(missing_ok=True)
        models.append(model.eval())
    return SasrecFolds(fold_of_user, models, np.stack(trained), int(settings.max_len), int(settings.hidden))


def sasrec_settings(cfg):
    """The settings of the source's fold models: the study's SASRec (`evaluation.sasrec_*`, history
    `methods.long_m` by default), at `user_signal.sasrec_lr` (default the first of `evaluation.sasrec_lr_grid`)."""
    from workbench.study.baselines import SasrecSettings

    ev, us = cfg.evaluation, cfg.user_signal
    lr = us.sasrec_lr if us.sasrec_lr is not None else ev.sasrec_lr_grid[0]
    return SasrecSettings(max_len=ev.sasrec_max_len or cfg.methods.long_m, epochs=ev.sasrec_epochs, seed=cfg.seed,
                          lr=float(lr))


# ---- the study's source ---------------------------------------------------------------------------
def source_spec(cfg) -> dict:
    """The `user_signal` knobs the source reads (others do not enter its key)."""
    us = cfg.user_signal
    spec = {"source": us.source, "history": us.history}
    if us.source == "als":
        spec["als_test_vectors"] = us.als_test_vectors
    elif us.source == "features":
        spec["max_categories"] = us.max_categories
    elif us.source == "sasrec":
        spec.update(folds=us.sasrec_folds, settings=sasrec_settings(cfg).__dict__)
    return spec


def signal_key(cfg, source_key: str) -> str:
    """The key of the study's user signal: its knobs, the key of what its source was built from, the user
    quantizer's config and the seed. Only the methods that read a signal carry it in their train key."""
    return section_hash("user_signal", CACHE_FORMAT, source_spec(cfg), source_key, cfg.user_sids, cfg.seed)


def readers(cfg) -> list[str]:
    return [m for m in cfg.methods.run if methods.get(m).reads_signal]


def build_user_signal(ctx) -> None:
    """The study's user signal after the semantic-IDs stage: `ctx.user_signal` (a `prompts.UserEncoder`) and
    `ctx.keys["user_signal"]`. The SASRec folds are trained (and the source's own user quantizer fitted) only when a
    method in `methods.run` reads them; without one, `ctx.user_signal` is None for the sasrec source."""
    from workbench.cache import cached
    from workbench.study.context import say
    from workbench.study.prompts import UserEncoder

    cfg, us = ctx.cfg, ctx.cfg.user_signal
    wanted = readers(cfg)
    split = ctx.split
    if us.source == "als":
        source, source_key = AlsSource(ctx.als, ctx.als_folds, us.als_test_vectors), ctx.keys["embeddings"]
    elif us.source == "features":
        if ctx.dataset.user_features is None:
            raise SignalSourceError(
                f"user_signal.source: features needs user features, and dataset {ctx.dataset.name!r} has none; "
                "ml-100k and ml-1m ship them, a dataset of files names its user file under dataset.users "
                "(data/README.md); or choose another user_signal.source (als, sasrec)")
        enc = FeatureEncoding.fit(ctx.dataset.user_features, us.max_categories)
        source, source_key = FeatureSource(enc.transform(ctx.dataset.user_features), enc), ctx.keys["data"]
    elif us.source == "embeddings":
        if ctx.dataset.user_embeddings is None:
            raise SignalSourceError(
                f"user_signal.source: embeddings needs a user-embedding table, and dataset {ctx.dataset.name!r} has "
                "none; name it under dataset.user_embeddings (data/README.md), or choose another user_signal.source "
                "(als, features, sasrec)")
        from workbench.data.user_embeddings import UserEmbeddings

        table = UserEmbeddings.from_table(ctx.dataset.user_embeddings, ctx.dataset.n_users)
        source, source_key = EmbeddingSource(table, split.train_times()), ctx.keys["data"]
    else:
        source, source_key = _sasrec_source(ctx, wanted) if wanted else (None, ctx.keys["data"])
    key = signal_key(cfg, source_key)
    ctx.keys["user_signal"] = key
    if source is None:
        ctx.user_signal = None
        return
    codes = None
    if us.source == "als" and us.als_test_vectors == "full":
        codes = ctx.user_quantizer.encode  # the semantic-IDs stage's, fitted on the full-train ALS vectors
    elif any(methods.get(m).signal == methods.USER_SIDS for m in wanted):
        codes = _user_quantizer(ctx, source, key, cached, say).encode
    ctx.user_signal = UserEncoder(vectors=source.vectors, dim=source.dim, codes=codes,
                                  train_vectors=source.train_vectors, history=us.history)
    say(f"  user signal: {us.source} ({source.dim}-d, history {us.history}"
        + (f", test vectors {us.als_test_vectors}" if us.source == "als" else "") + ")")


def fit_vectors(source, split) -> np.ndarray:
    """[n_users, dim]: each user's vector as of their whole train sequence (what the user quantizer is fitted on)."""
    train, times = split.train_sequences(), split.train_times()
    users = np.arange(len(train))
    as_of = np.array([int(t[-1]) if len(t) else -1 for t in times], dtype=np.int64)
    return np.asarray(source.vectors(users, train, as_of), dtype=np.float32)


def _user_quantizer(ctx, source, key: str, cached, say):
    from workbench.sids.quantize import load_quantizer, make_quantizer, quantizer_stats

    cfg = ctx.cfg

    def compute(folder: Path):
        t0 = time.perf_counter()
        x = fit_vectors(source, ctx.split)
        uq = make_quantizer(cfg.user_sids, cfg.seed).fit(x, show_progress=True)
        uq.save(folder / "user_quantizer.npz")
        stats = {f"user_signal/{k}": v for k, v in quantizer_stats(uq, x, uq.encode(x)).items()}
        return uq, {"stats": {**stats, "time/compute/user_signal_quantizer_s": time.perf_counter() - t0}}

    uq, info, _ = cached("user_signal", key, compute, lambda f, i: load_quantizer(f / "user_quantizer.npz"), say)
    if tuple(uq.codebook_sizes) != tuple(ctx.user_codebooks):
        raise ValueError(f"the user quantizer of source {cfg.user_signal.source} has codebooks {uq.codebook_sizes}, "
                         f"the layout {ctx.user_codebooks}: both come from user_sids, so they must agree")
    ctx.run.log_metrics(info["stats"])
    return uq


def _sasrec_source(ctx, wanted) -> tuple[SasrecFolds, str]:
    import torch

    from workbench.cache import cached
    from workbench.study.baselines import build_sasrec
    from workbench.study.context import say

    cfg, split = ctx.cfg, ctx.split
    st = sasrec_settings(cfg)
    n_folds = cfg.user_signal.sasrec_folds
    key = section_hash("sasrec_folds", CACHE_FORMAT, st.__dict__, n_folds, cfg.seed, ctx.keys["data"])
    n_items = ctx.dataset.n_items

    def compute(folder: Path):
        t0 = time.perf_counter()
        folds = fit_sasrec_folds(split.train_sequences(), split.valid_items(), n_items, n_folds, st, cfg.seed,
                                 folder=folder, say=say)
        np.savez(folder / "sasrec_folds.npz", fold_of_user=folds.fold_of_user, trained_users=folds.trained_users)
        return folds, {"stats": {"time/compute/sasrec_folds_s": time.perf_counter() - t0}, "for": wanted}

    def load(folder: Path, info: dict):
        z = np.load(folder / "sasrec_folds.npz")
        models = []
        for k in range(n_folds):
            m = build_sasrec(n_items, st)
            m.load_state_dict(torch.load(folder / f"fold_{k}.pt"))
            models.append(m.eval())
        return SasrecFolds(z["fold_of_user"], models, z["trained_users"], int(st.max_len), int(st.hidden))

    folds, _, _ = cached("sasrec_folds", key, compute, load, say, resumable=True)
    return folds, key
