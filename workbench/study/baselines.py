"""Baselines on the same split and metrics as the generative methods: popularity, SASRec and ALS.

- Popularity: items ranked by their number of train interactions (train split only: neither the
  valid nor the test items count), each user's seen items excluded.
- SASRec (Kang & McAuley, 2018): a causal self-attention model over item ids, trained with
  full-softmax cross-entropy over the catalog at every position, its history `evaluation.sasrec_max_len` items
  (default: the prompts' `methods.long_m`), early-stopped on validation NDCG@10 (seen items excluded) after
  `evaluation.sasrec_patience` epochs without a better one (None: all `sasrec_epochs`). Every
  transition of every train sequence is a target (windows of `max_len + 1` items, `sasrec_windows`),
  not only the last `max_len` of each user.
  Its top-100 per test user are also the candidates the generative models re-rank with `score`.
- ALS: the dot-product ranker `als_rank` (its ALS is fitted and picked in `stages/evaluate.py`).
  EASE lives in `ease.py`; both rank with `evaluate.top_k_rows` (ties by item id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from workbench import names
from workbench.study.evaluate import per_user_metrics, ranks_of, top_k_excluding, top_k_rows


def popularity_scores(train: Sequence[np.ndarray], n_items: int) -> np.ndarray:
    """[n_items] train interaction counts."""
    if len(train) == 0:
        return np.zeros(n_items)
    return np.bincount(np.concatenate([np.asarray(s, dtype=np.int64) for s in train]), minlength=n_items).astype(np.float64)


def popularity_rank(train: Sequence[np.ndarray], n_items: int, seen: Sequence[np.ndarray], k: int) -> list[list[int]]:
    """Top-k most popular items per user, the user's seen items excluded (ties: lower item id first)."""
    pop = popularity_scores(train, n_items)
    order = np.argsort(-pop, kind="stable")
    out = []
    for s in seen:
        banned = set(np.asarray(s).tolist())
        lst = []
        for it in order:
            if int(it) not in banned:
                lst.append(int(it))
                if len(lst) == k:
                    break
        out.append(lst)
    return out


@dataclass
class SasrecSettings:
    max_len: int = 50
    hidden: int = 64
    layers: int = 2
    heads: int = 2
    dropout: float = 0.2
    lr: float = 2e-3
    batch_size: int = 64
    epochs: int = 30
    patience: int | None = 5  # epochs without a better valid NDCG@10 before it stops (None: all `epochs` run)
    seed: int = 0
    progress: bool = True
    # "fused" / "chunked": the full-softmax loss in row chunks over the positions with a target (study/lm_loss.py; the
    # same function in float32; chunked: a step 1.3x faster than full at ML-1M's shape, docs/results/2026-12-04-
    # training-throughput-intel-amx.md; fused: each chunk's elementwise work one compiled kernel, the loss 1.2x faster
    # than chunked there); "full": the [B, L, n_items] logits kept
    loss: str = "fused"


@dataclass
class SasrecResult:
    model: object
    settings: SasrecSettings
    best_epoch: int  # 0 = the first (its history rows' "epoch"; reported 1-based: stages/evaluate.sasrec_epochs)
    best_valid_ndcg10: float
    history: list[dict] = field(default_factory=list)
    wall_s: float = 0.0


def build_sasrec(n_items: int, st: SasrecSettings):
    import torch
    from torch import nn

    class SASRec(nn.Module):
        """Item ids shifted by one (0 = padding); left-padded sequences of length max_len."""

        def __init__(self):
            super().__init__()
            self.item = nn.Embedding(n_items + 1, st.hidden, padding_idx=0)
            self.pos = nn.Embedding(st.max_len, st.hidden)
            self.drop = nn.Dropout(st.dropout)
            layer = nn.TransformerEncoderLayer(st.hidden, st.heads, st.hidden * 2, st.dropout, batch_first=True,
                                               norm_first=True, activation="gelu")
            self.encoder = nn.TransformerEncoder(layer, st.layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(st.hidden)
            # nn.Embedding's N(0, 1) init times sqrt(hidden) gave inputs of std 8 that swamp the position
            # embeddings and tied output logits of std ~8 (a near one-hot softmax at step 0): SASRec then
            # trained below popularity. Rows of std hidden**-0.5 give unit-scale inputs and logits.
            nn.init.normal_(self.item.weight, std=st.hidden**-0.5)
            nn.init.normal_(self.pos.weight, std=st.hidden**-0.5)
            with torch.no_grad():
                self.item.weight[0].zero_()

        def forward(self, seq):  # [B, L] -> [B, L, H]
            b, L = seq.shape
            real = seq > 0
            x = self.item(seq) * (st.hidden**0.5) + self.pos(torch.arange(L, device=seq.device))[None]
            x = self.drop(x) * real[..., None]
            causal = torch.ones(L, L, dtype=torch.bool, device=seq.device).tril()
            allowed = causal[None] & (real[:, None, :] | torch.eye(L, dtype=torch.bool, device=seq.device)[None])
            mask = (~allowed).repeat_interleave(st.heads, dim=0)  # [B*heads, L, L] True = blocked
            return self.norm(self.encoder(x, mask=mask))

        def logits(self, h):  # [..., H] -> [..., n_items]
            return h @ self.item.weight[1:].T

    return SASRec()


def _pad_left(seqs: Sequence[Sequence[int]], L: int) -> np.ndarray:
    out = np.zeros((len(seqs), L), dtype=np.int64)
    for i, s in enumerate(seqs):
        s = list(s)[-L:]
        if s:
            out[i, L - len(s) :] = np.asarray(s) + 1
    return out


def sasrec_scores(model, histories: Sequence[Sequence[int]], max_len: int, batch: int = 256) -> np.ndarray:
    """[n_users, n_items] next-item logits after each history."""
    return _after(model, histories, max_len, batch, model.logits)


def sasrec_states(model, histories: Sequence[Sequence[int]], max_len: int, batch: int = 256) -> np.ndarray:
    """[n, hidden] the user state after each history (its last `max_len` items): the last position's hidden
    state, which the next-item logits are read from (the `sasrec` user-signal source)."""
    return _after(model, histories, max_len, batch, lambda h: h)


def _after(model, histories, max_len: int, batch: int, head) -> np.ndarray:
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(histories), batch):
            x = torch.from_numpy(_pad_left(histories[s : s + batch], max_len))
            out.append(head(model(x)[:, -1]).numpy())
    return np.concatenate(out) if out else np.zeros((0, 0))


def sasrec_rank(model, histories, seen, k: int, max_len: int) -> list[list[int]]:
    return top_k_excluding(sasrec_scores(model, histories, max_len), seen, k)


def sasrec_windows(train: Sequence[np.ndarray], max_len: int) -> list[np.ndarray]:
    """Windows of at most max_len + 1 items covering every transition of every train sequence once.

    Windows are cut from the end of each sequence backwards, overlapping by one item, so each item
    after the first is a target exactly once and the newest window always ends at the newest item.
    Training on the last `max_len + 1` items only would throw away most of a long sequence (on
    MovieLens-100K with max_len 10: ~10 of ~90 transitions per user).
    """
    out = []
    for s in train:
        s = np.asarray(s, dtype=np.int64)
        end = len(s)
        while end >= 2:
            start = max(0, end - (max_len + 1))
            out.append(s[start:end])
            end = start + 1  # the window's first item is the previous window's last target
            if start == 0:
                break
    return out


def sasrec_loss(model, x, y, kind: str = "fused"):
    """Mean full-softmax cross-entropy over the positions of `x` [B, L] with a target in `y` [B, L] (-1: none)."""
    import torch

    h = model(x)  # [B, L, H]
    if kind == "full":
        logits = model.logits(h)  # [B, L, n_items]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-1)
    from workbench.study.lm_loss import chunked_lm_loss

    flat, keep = y.reshape(-1), y.reshape(-1) >= 0
    return chunked_lm_loss(h.reshape(-1, h.shape[-1])[keep], model.item.weight[1:], flat[keep], torch.float32,
                           fused=kind == "fused")


def train_sasrec(
    train: Sequence[np.ndarray], valid: np.ndarray, n_items: int, st: SasrecSettings, log_fn=None,
    resume_file: Path | None = None,
) -> SasrecResult:
    """Full-softmax CE on every position of each train sequence; early stopping on valid NDCG@10 after
    `st.patience` epochs without a better one (None: all `st.epochs`); the best epoch's weights are returned.

    With `resume_file` the state after every epoch is saved there (weights, optimizer, both RNGs, the best
    epoch so far), and a call that finds it goes on after that epoch, ending as the uninterrupted run would
    (tested bit for bit): on ML-1M one SASRec is ~40 minutes of a shared core, too long to lose to a
    session's end. The file is left for the caller to remove once the model is stored.
    """
    import copy
    import time

    import torch

    from workbench.cache import load_state, save_state
    from workbench.progress import progress

    torch.manual_seed(st.seed)
    rng = np.random.default_rng(st.seed)
    model = build_sasrec(n_items, st)
    opt = torch.optim.Adam(model.parameters(), lr=st.lr)
    seqs = sasrec_windows(train, st.max_len)
    x_all = _pad_left([s[:-1] for s in seqs], st.max_len)  # inputs
    y_all = _pad_left([s[1:] for s in seqs], st.max_len) - 1  # targets (-1 = padding)
    valid_users = np.flatnonzero(valid >= 0)
    best, best_state, best_epoch, bad, hist = -1.0, None, 0, 0, []
    first, stopped, t0 = 0, False, time.perf_counter()
    saved = load_state(resume_file) if resume_file is not None else None
    if saved is not None:  # go on after the last finished epoch, as if never stopped
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["torch_rng"])
        rng.bit_generator.state = saved["numpy_rng"]
        best, best_state, best_epoch, bad, hist = (saved[k] for k in (
            "best", "best_state", "best_epoch", "bad", "history"))  # fmt: skip
        first, stopped, t0 = saved["epochs_done"], saved["stopped"], t0 - saved["wall_s"]
        print(f"[SASRec] resuming after epoch {first} of {st.epochs} from {resume_file}", flush=True)
    epochs = range(first, st.epochs) if not stopped else range(0)
    for epoch in progress(epochs, desc="SASRec", unit="epoch", enabled=st.progress):
        model.train()
        order = rng.permutation(len(seqs))
        tot, nb = 0.0, 0
        for s in range(0, len(order), st.batch_size):
            idx = order[s : s + st.batch_size]
            x, y = torch.from_numpy(x_all[idx]), torch.from_numpy(y_all[idx])
            loss = sasrec_loss(model, x, y, st.loss)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            tot, nb = tot + float(loss.detach()), nb + 1
        lists = sasrec_rank(model, [train[u] for u in valid_users], [train[u] for u in valid_users], 10, st.max_len)
        ndcg = float(per_user_metrics(ranks_of(lists, valid[valid_users]), (10,))[names.ndcg_at(10)].mean())
        hist.append({"epoch": epoch, "loss": tot / max(1, nb), "valid_ndcg10": ndcg})
        if log_fn:
            log_fn({"sasrec/train_loss": tot / max(1, nb), "sasrec/valid_ndcg@10": ndcg}, epoch)
        if ndcg > best:
            best, best_state, best_epoch, bad = ndcg, copy.deepcopy(model.state_dict()), epoch, 0
        else:
            bad += 1
        stopped = st.patience is not None and bad >= st.patience
        if resume_file is not None:
            save_state(resume_file, {
                "epochs_done": epoch + 1, "stopped": stopped, "model": model.state_dict(),
                "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state(), "numpy_rng": rng.bit_generator.state,
                "best": best, "best_state": best_state, "best_epoch": best_epoch, "bad": bad, "history": hist,
                "wall_s": time.perf_counter() - t0,
            })  # fmt: skip
        if stopped:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return SasrecResult(model, st, best_epoch, best, hist, time.perf_counter() - t0)


def als_rank(
    user_vectors: np.ndarray, item_factors: np.ndarray, seen: Sequence[np.ndarray], k: int, chunk: int = 1024
) -> list[np.ndarray]:
    """ALS dot-product ranker: top-k items by user vector . item factors, seen items banned.

    Ties are broken by item id (lower first), so lists do not depend on `chunk` or on how
    argpartition orders equal scores. Users are scored `chunk` rows at a time: [chunk, n_items]
    float64 scores (30 MB at 1,024 x 3,706; all 6,040 x 3,706 users x items, f = 64, k = 100 in
    ~0.6 s on CPU). A user with fewer than k unseen items gets them all.
    """
    u = np.asarray(user_vectors, dtype=np.float64)  # [n, f]
    v = np.asarray(item_factors, dtype=np.float64)  # [n_items, f]
    out: list[np.ndarray] = []
    for c in range(0, len(u), chunk):
        # einsum, not `@`: BLAS sums in an order that depends on the number of rows (small chunks
        # take other kernels), so last-bit differences would let `chunk` reorder near-ties
        s = np.einsum("mf,if->mi", u[c : c + chunk], v)  # [m, n_items]
        out.extend(top_k_rows(s, seen[c : c + len(s)], k))
    return out
