"""EASE (Steck, 2019, "Embarrassingly Shallow Autoencoders for Sparse Data"): a strong non-sequential baseline.

An item-item linear model with a closed form: X the binary [users, items] matrix of train interactions,
P = (X^T X + lambda I)^-1, B = I - P diag(1 / diag(P)) (so diag(B) = 0: an item does not predict itself), and a
user's scores are x_u B, x_u the binary vector of the items in the user's history. Dense numpy in float64:
at ML-1M's 3,706 items the Gram matrix and B are 110 MB each and one solve a few seconds.

Protocol (the other baselines' in `stages/evaluate.py`): lambda is picked on validation NDCG@10 from
`evaluation.ease_lambda_grid`, B fitted on the train sequences, each user's history = train, the train items
banned, the valid item the target. The test ranking uses the B of the picked lambda as fitted on train, with the
history train + valid (train and valid banned). Nothing is refitted on train + valid, as for `als` (item factors
from train, users folded in with train + valid) and `sasrec` (trained on train, fed train + valid); only the
history a user is scored with grows. On ML-1M with this leave-one-out split the literature reports N@10 ~0.054.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from workbench import names


def _binary(histories: Sequence[np.ndarray], n_items: int):
    """[n, n_items] scipy CSR, 1.0 where the user's history holds the item (a repeated item counts once)."""
    import scipy.sparse as sp

    rows = np.repeat(np.arange(len(histories)), [len(h) for h in histories])
    cols = np.concatenate([np.asarray(h, dtype=np.int64) for h in histories]) if len(histories) else np.empty(0, int)
    if len(cols) and (cols.min() < 0 or cols.max() >= n_items):
        raise ValueError(f"EASE: item ids must be in [0, {n_items}), got {cols.min()}..{cols.max()}")
    x = sp.csr_matrix((np.ones(len(cols)), (rows, cols)), shape=(len(histories), n_items), dtype=np.float64)
    x.data[:] = 1.0  # duplicates were summed: binary again
    return x


def gram(train: Sequence[np.ndarray], n_items: int) -> np.ndarray:
    """X^T X [n_items, n_items] float64 of the binary train matrix (computed once for every lambda)."""
    x = _binary(train, n_items)
    return np.asarray((x.T @ x).todense(), dtype=np.float64)


def ease_weights(g: np.ndarray, lam: float) -> np.ndarray:
    """B = I - P diag(1/diag(P)), P = (G + lam I)^-1, from the Gram matrix G = X^T X; float64, diag(B) = 0."""
    import scipy.linalg

    if not lam > 0:
        raise ValueError(f"EASE: lambda must be > 0 (it keeps G + lambda I invertible), got {lam}")
    a = g + lam * np.eye(len(g))
    p = scipy.linalg.cho_solve(scipy.linalg.cho_factor(a, lower=True), np.eye(len(g)))  # symmetric positive definite
    b = -p / np.diag(p)[None, :]  # B_ij = -P_ij / P_jj (i != j)
    np.fill_diagonal(b, 0.0)
    return b


def ease_rank(b: np.ndarray, histories: Sequence[np.ndarray], seen: Sequence[np.ndarray], k: int,
              chunk: int = 1024) -> list[np.ndarray]:
    """Top-k items by x_u B per user, `seen[u]` banned, ties by item id (`evaluate.top_k_rows`).

    x_u is the binary vector of `histories[u]`; users are scored `chunk` rows at a time (a sparse-dense
    product sums each row on its own, so lists do not depend on `chunk`)."""
    from workbench.study.evaluate import top_k_rows

    out: list[np.ndarray] = []
    for c in range(0, len(histories), chunk):
        x = _binary(histories[c : c + chunk], len(b))
        s = np.asarray(x @ b, dtype=np.float64)  # [m, n_items]
        out.extend(top_k_rows(s, seen[c : c + len(s)], k))
    return out


@dataclass
class EaseResult:
    """The picked lambda, its B (fitted on train), and what every lambda of the grid scored on validation."""

    weights: np.ndarray  # B [n_items, n_items]
    lam: float
    valid_ndcg10: float
    per_lambda: dict[float, float] = field(default_factory=dict)  # lambda -> valid NDCG@10
    fit_s: float = 0.0  # the solve of the picked lambda
    wall_s: float = 0.0  # the Gram matrix, every lambda's solve and validation


def ease_tune(train: Sequence[np.ndarray], valid: np.ndarray, n_items: int, grid: Sequence[float],
              say: Callable[[str], None] | None = None) -> EaseResult:
    """Fit B on `train` for every lambda of `grid` and keep the one with the best validation NDCG@10.

    Validation: each user with a valid item (`valid[u] >= 0`) is scored with the train history, the train items
    banned, and ranked against `valid[u]`. The first lambda of the grid wins a tie.
    """
    from workbench.study.evaluate import per_user_metrics, ranks_of

    if len(grid) == 0:
        raise ValueError("evaluation.ease_lambda_grid is empty: give at least one lambda, e.g. [50, 200, 500, 1000]")
    t0 = time.perf_counter()
    g = gram(train, n_items)
    users = np.flatnonzero(np.asarray(valid) >= 0)
    hist = [train[u] for u in users]
    best: tuple[float, float, np.ndarray, float] | None = None
    per: dict[float, float] = {}
    for lam in grid:
        t1 = time.perf_counter()
        b = ease_weights(g, float(lam))
        fit_s = time.perf_counter() - t1
        lists = ease_rank(b, hist, hist, 10)
        ndcg = float(per_user_metrics(ranks_of(lists, valid[users]), (10,))[names.ndcg_at(10)].mean())
        per[float(lam)] = ndcg
        if say:
            say(f"  ease lambda={float(lam):g}: valid NDCG@10 {ndcg:.4f} (solve {fit_s:.1f}s)")
        if best is None or ndcg > best[1]:
            best = (float(lam), ndcg, b, fit_s)
    lam, ndcg, b, fit_s = best
    return EaseResult(b, lam, ndcg, per, fit_s, time.perf_counter() - t0)
