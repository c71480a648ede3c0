"""Residual quantizers that turn item (and user) vectors into Semantic-ID codes.

Two kinds, one interface (`fit(x) -> self`, `encode(x) -> [n, levels] codes`, `decode(codes) -> x̂`):

- `RQKMeans`: residual k-means. Level 0 clusters the vectors, level l clusters what the earlier
  levels left over (x − Σ centroids). Plain, fast, and the usual baseline (scikit-learn KMeans,
  k-means++ init, one fixed seed per level).
- `RQVAE`: an MLP autoencoder whose latent is residual-quantized with learned codebooks
  (straight-through gradients, commitment loss; TIGER-style). Codebooks start from RQ-KMeans on
  the initial latents and unused codes are restarted from data during the first half of training,
  which keeps utilization high on small catalogs.

Both are deterministic for a seed on a given machine. Codes are not unique: `item_sids` appends the
dedup digit (`semantic_ids.add_dedup_digit`) so every item's SID is unique; users get no dedup
(several users may share a user SID, and `code_stats` reports how many).

Stats (`code_stats`, `quantizer_stats`): codebook utilization per level (codes used / codebook size),
collision rate before dedup (share of items whose codes equal another item's), the largest group
sharing each prefix length, and the quantization error (share of the vectors' variance the
reconstruction misses, comparable across kinds and vector types).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

KINDS = ("rq_kmeans", "rq_vae")


class ResidualQuantizer(Protocol):
    kind: str
    codebook_sizes: tuple[int, ...]

    def fit(self, x: np.ndarray) -> "ResidualQuantizer": ...
    def encode(self, x: np.ndarray) -> np.ndarray: ...
    def decode(self, codes: np.ndarray) -> np.ndarray: ...
    def save(self, path: Path) -> None: ...


def _kmeans(x: np.ndarray, k: int, iters: int, seed: int) -> np.ndarray:
    """k-means++ / Lloyd centroids [k_eff, d] with k_eff = min(k, distinct rows)."""
    from sklearn.cluster import KMeans

    n_distinct = len(np.unique(x.round(6), axis=0))
    k_eff = max(1, min(k, n_distinct))
    km = KMeans(n_clusters=k_eff, init="k-means++", n_init=1, max_iter=iters, random_state=seed, algorithm="lloyd")
    km.fit(x.astype(np.float64))
    return km.cluster_centers_.astype(np.float32)


def _nearest(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid per row (squared Euclidean), [n]."""
    d = (x * x).sum(1, keepdims=True) - 2.0 * x @ centroids.T + (centroids * centroids).sum(1)[None]
    return d.argmin(axis=1).astype(np.int64)


# ---- RQ-KMeans ------------------------------------------------------------------------------------
class RQKMeans:
    """Residual k-means: `levels` codebooks of `codebook_size` centroids over successive residuals."""

    kind = "rq_kmeans"

    def __init__(self, levels: int, codebook_size: int, iters: int = 25, seed: int = 0):
        if levels < 1 or codebook_size < 2:
            raise ValueError(f"need levels >= 1 and codebook_size >= 2, got {levels}, {codebook_size}")
        self.levels, self.codebook_size, self.iters, self.seed = levels, codebook_size, iters, seed
        self.codebooks: list[np.ndarray] = []  # per level [k_eff <= codebook_size, d]

    @property
    def codebook_sizes(self) -> tuple[int, ...]:
        return (self.codebook_size,) * self.levels

    def fit(self, x: np.ndarray, show_progress: bool = False) -> "RQKMeans":
        from workbench.progress import progress

        r = np.asarray(x, dtype=np.float32).copy()
        self.codebooks = []
        for lvl in progress(range(self.levels), desc="rq-kmeans levels", enabled=show_progress):
            c = _kmeans(r, self.codebook_size, self.iters, self.seed * 1000 + lvl)
            self.codebooks.append(c)
            r -= c[_nearest(r, c)]
        return self

    def encode(self, x: np.ndarray) -> np.ndarray:
        self._check_fitted()
        r = np.asarray(x, dtype=np.float32).copy()
        codes = np.zeros((len(r), self.levels), dtype=np.int64)
        for lvl, c in enumerate(self.codebooks):
            codes[:, lvl] = _nearest(r, c)
            r -= c[codes[:, lvl]]
        return codes

    def decode(self, codes: np.ndarray) -> np.ndarray:
        self._check_fitted()
        codes = np.asarray(codes, dtype=np.int64)
        return sum(c[codes[:, lvl]] for lvl, c in enumerate(self.codebooks))

    def _check_fitted(self) -> None:
        if not self.codebooks:
            raise RuntimeError("quantizer is not fitted; call fit(x) first")

    def save(self, path: Path) -> None:
        meta = {"kind": self.kind, "levels": self.levels, "codebook_size": self.codebook_size}
        meta.update(iters=self.iters, seed=self.seed)
        np.savez(path, meta=json.dumps(meta), **{f"codebook_{i}": c for i, c in enumerate(self.codebooks)})

    @classmethod
    def _from_npz(cls, z, meta: dict) -> "RQKMeans":
        q = cls(meta["levels"], meta["codebook_size"], meta["iters"], meta["seed"])
        q.codebooks = [z[f"codebook_{i}"] for i in range(meta["levels"])]
        return q


# ---- RQ-VAE ---------------------------------------------------------------------------------------
_VAE_KEYS = ("levels", "codebook_size", "hidden", "latent", "epochs", "lr", "beta", "batch_size", "seed", "kmeans_iters")

class RQVAE:
    """MLP autoencoder with a residual-quantized latent (straight-through, commitment loss)."""

    kind = "rq_vae"

    def __init__(
        self,
        levels: int,
        codebook_size: int,
        hidden: int = 128,
        latent: int = 32,
        epochs: int = 60,
        lr: float = 1e-3,
        beta: float = 0.25,
        batch_size: int = 64,
        seed: int = 0,
        kmeans_iters: int = 25,
    ):
        if levels < 1 or codebook_size < 2:
            raise ValueError(f"need levels >= 1 and codebook_size >= 2, got {levels}, {codebook_size}")
        self.levels, self.codebook_size = levels, codebook_size
        self.hidden, self.latent, self.epochs, self.lr, self.beta = hidden, latent, epochs, lr, beta
        self.batch_size, self.seed, self.kmeans_iters = batch_size, seed, kmeans_iters
        self.net = None  # torch modules once fitted
        self.mean: np.ndarray | None = None
        self.scale: float = 1.0
        self.history: list[float] = []  # mean training loss per epoch

    @property
    def codebook_sizes(self) -> tuple[int, ...]:
        return (self.codebook_size,) * self.levels

    def _build(self, dim: int):
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(s):
                super().__init__()
                s.enc = nn.Sequential(nn.Linear(dim, self.hidden), nn.ReLU(), nn.Linear(self.hidden, self.latent))
                s.dec = nn.Sequential(nn.Linear(self.latent, self.hidden), nn.ReLU(), nn.Linear(self.hidden, dim))
                s.codebooks = nn.Parameter(torch.zeros(self.levels, self.codebook_size, self.latent))

            def quantize(s, z):
                """z [B, latent] -> (codes [B, L], quantized [B, latent], per-level residuals and codes)."""
                r, q, codes, pairs = z, torch.zeros_like(z), [], []
                for lvl in range(self.levels):
                    cb = s.codebooks[lvl]  # [K, latent]
                    d = (r * r).sum(1, keepdim=True) - 2 * r @ cb.T + (cb * cb).sum(1)[None]
                    idx = d.argmin(1)
                    e = cb[idx]
                    pairs.append((r, e))
                    codes.append(idx)
                    q = q + e
                    r = r - e.detach()
                return torch.stack(codes, 1), q, pairs

        return Net()

    def _to_input(self, x: np.ndarray):
        import torch

        return torch.from_numpy(((np.asarray(x, np.float32) - self.mean) / self.scale).astype(np.float32))

    def fit(self, x: np.ndarray, show_progress: bool = False) -> "RQVAE":
        import torch

        x = np.asarray(x, dtype=np.float32)
        self.history = []
        self.mean = x.mean(0)
        self.scale = float(np.sqrt(((x - self.mean) ** 2).sum(1).mean()) + 1e-8)  # unit mean norm
        xt = self._to_input(x)
        n = len(xt)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny MLP: thread sync costs more than it saves (and keeps runs deterministic)
        try:
            self._train(xt, x.shape[1], show_progress)
        finally:
            torch.set_num_threads(threads)
        return self

    def _train(self, xt, dim: int, show_progress: bool) -> None:
        import torch

        from workbench.progress import progress

        n = len(xt)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            gen = torch.Generator().manual_seed(self.seed)
            net = self._build(dim)
            with torch.no_grad():  # codebooks start as residual k-means of the initial latents
                init = RQKMeans(self.levels, self.codebook_size, self.kmeans_iters, self.seed).fit(net.enc(xt).numpy())
                for lvl, c in enumerate(init.codebooks):
                    cb = np.resize(c, (self.codebook_size, c.shape[1]))  # k_eff < K on tiny data: repeat
                    net.codebooks.data[lvl] = torch.from_numpy(cb)
            opt = torch.optim.Adam(net.parameters(), lr=self.lr)
            bar = progress(range(self.epochs), desc="rq-vae epochs", enabled=show_progress)
            for epoch in bar:
                perm = torch.randperm(n, generator=gen)
                total = 0.0
                for s in range(0, n, self.batch_size):
                    xb = xt[perm[s : s + self.batch_size]]
                    z = net.enc(xb)
                    _, q, pairs = net.quantize(z)
                    zq = z + (q - z).detach()  # straight-through
                    loss = torch.nn.functional.mse_loss(net.dec(zq), xb, reduction="sum") / len(xb)
                    for r, e in pairs:
                        codebook = ((r.detach() - e) ** 2).sum(1).mean()  # pulls codes to the encoder
                        commit = ((r - e.detach()) ** 2).sum(1).mean()  # keeps the encoder near its codes
                        loss = loss + codebook + self.beta * commit
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    total += loss.item() * len(xb)
                self.history.append(total / n)
                bar.set_postfix(loss=f"{total / n:.4f}")
                if epoch < self.epochs // 2:
                    self._restart_dead_codes(net, xt, gen)
        self.net = net.eval()

    @staticmethod
    def _restart_dead_codes(net, xt, gen) -> None:
        """Move codes no item uses onto residuals of random items (keeps utilization up)."""
        import torch

        with torch.no_grad():
            r = net.enc(xt)
            for lvl in range(net.codebooks.shape[0]):
                cb = net.codebooks.data[lvl]
                d = (r * r).sum(1, keepdim=True) - 2 * r @ cb.T + (cb * cb).sum(1)[None]
                idx = d.argmin(1)
                dead = torch.ones(cb.shape[0], dtype=torch.bool)
                dead[idx] = False
                if dead.any():
                    pick = torch.randint(0, len(r), (int(dead.sum()),), generator=gen)
                    cb[dead] = r[pick]
                    d = (r * r).sum(1, keepdim=True) - 2 * r @ cb.T + (cb * cb).sum(1)[None]
                    idx = d.argmin(1)  # re-assign: the restarted codes now own their items
                r = r - cb[idx]

    def _check_fitted(self) -> None:
        if self.net is None:
            raise RuntimeError("quantizer is not fitted; call fit(x) first")

    def encode(self, x: np.ndarray) -> np.ndarray:
        import torch

        self._check_fitted()
        with torch.no_grad():
            codes, _, _ = self.net.quantize(self.net.enc(self._to_input(x)))
        return codes.numpy().astype(np.int64)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        import torch

        self._check_fitted()
        codes = torch.as_tensor(np.asarray(codes, dtype=np.int64))
        with torch.no_grad():
            q = sum(self.net.codebooks[lvl][codes[:, lvl]] for lvl in range(self.levels))
            out = self.net.dec(q).numpy()
        return out * self.scale + self.mean

    def _meta(self) -> dict:
        return {"kind": self.kind, **{k: getattr(self, k) for k in _VAE_KEYS}}

    def save(self, path: Path) -> None:
        self._check_fitted()
        state = {f"state.{k}": v.detach().numpy() for k, v in self.net.state_dict().items()}
        meta = {**self._meta(), "scale": self.scale, "history": self.history}
        np.savez(path, meta=json.dumps(meta), mean=self.mean, **state)

    @classmethod
    def _from_npz(cls, z, meta: dict) -> "RQVAE":
        import torch

        q = cls(**{k: meta[k] for k in _VAE_KEYS})
        q.mean, q.scale, q.history = z["mean"], float(meta["scale"]), list(meta.get("history", []))
        net = q._build(len(q.mean))
        net.load_state_dict({k[6:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("state.")})
        q.net = net.eval()
        return q


# ---- construction, persistence, stats --------------------------------------------------------------
def make_quantizer(qcfg, seed: int = 0) -> ResidualQuantizer:
    """A quantizer from a `QuantizerConfig` section (semantic_ids or user_sids), `kind` overridable."""
    return make_quantizer_of_kind(qcfg.kind, qcfg, seed)


def make_quantizer_of_kind(kind: str, qcfg, seed: int = 0) -> ResidualQuantizer:
    if kind == "rq_kmeans":
        return RQKMeans(qcfg.levels, qcfg.codebook_size, qcfg.kmeans_iters, seed)
    if kind == "rq_vae":
        return RQVAE(
            qcfg.levels,
            qcfg.codebook_size,
            hidden=qcfg.vae_hidden,
            latent=qcfg.vae_latent,
            epochs=qcfg.vae_epochs,
            lr=qcfg.vae_lr,
            beta=qcfg.vae_beta,
            batch_size=qcfg.vae_batch_size,
            seed=seed,
            kmeans_iters=qcfg.kmeans_iters,
        )
    raise ValueError(f"unknown quantizer kind {kind!r}; choose one of {KINDS}")


def load_quantizer(path: Path) -> ResidualQuantizer:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        cls = {"rq_kmeans": RQKMeans, "rq_vae": RQVAE}[meta["kind"]]
        return cls._from_npz(z, meta)


def _group_sizes(codes: np.ndarray) -> np.ndarray:
    """Per row, how many rows share its exact code tuple."""
    _, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    return counts[inverse.reshape(-1)]


def code_stats(codes: np.ndarray, codebook_sizes: tuple[int, ...]) -> dict[str, float]:
    """Utilization per level, collisions and the largest group per prefix length (no prefix on keys)."""
    codes = np.asarray(codes, dtype=np.int64)
    n, levels = codes.shape
    out: dict[str, float] = {}
    for lvl in range(levels):
        out[f"utilization_l{lvl}"] = len(np.unique(codes[:, lvl])) / codebook_sizes[lvl]
        out[f"max_prefix_group_l{lvl + 1}"] = int(_group_sizes(codes[:, : lvl + 1]).max())
    sizes = _group_sizes(codes)
    out["collision_rate"] = float((sizes > 1).mean())  # share of rows whose codes equal another row's
    out["unique_share"] = len(np.unique(codes, axis=0)) / n  # distinct code tuples / rows
    out["max_prefix_group"] = int(sizes.max())  # largest group sharing the full code tuple
    out["n"] = n
    return out


def quantizer_stats(q: ResidualQuantizer, x: np.ndarray, codes: np.ndarray) -> dict[str, float]:
    """`code_stats` plus reconstruction error (unexplained variance share and raw MSE)."""
    x = np.asarray(x, dtype=np.float32)
    err = ((x - q.decode(codes)) ** 2).sum(1).mean()
    var = ((x - x.mean(0)) ** 2).sum(1).mean()
    stats = code_stats(codes, q.codebook_sizes)
    return {**stats, "quantization_error": float(err / max(var, 1e-12)), "quantization_mse": float(err)}


@dataclass
class ItemSids:
    """One fitted item quantizer and its codes: raw [n, L] and deduplicated [n, L + 1]."""

    kind: str
    quantizer: ResidualQuantizer
    codes: np.ndarray  # [n_items, levels] before dedup
    item_codes: np.ndarray  # [n_items, levels + 1], last column the dedup digit
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def max_dedup(self) -> int:
        return int(self.item_codes[:, -1].max())


def item_sids(q: ResidualQuantizer, x: np.ndarray, show_progress: bool = False) -> ItemSids:
    """Fit `q` on item vectors, encode, append the dedup digit, compute stats."""
    from workbench.sids.layout import add_dedup_digit

    q.fit(x, show_progress=show_progress)
    codes = q.encode(x)
    item_codes = add_dedup_digit(codes)
    stats = quantizer_stats(q, x, codes)
    stats["dedup_max_digit"] = int(item_codes[:, -1].max())
    return ItemSids(kind=q.kind, quantizer=q, codes=codes, item_codes=item_codes, stats=stats)


def dedup_size_for(max_digit: int) -> int:
    """Tokens in the dedup block: the next power of two above the largest digit (>= 1).

    Rounding up keeps the vocabulary layout stable when a re-fit moves the largest group by one.
    """
    need = int(max_digit) + 1
    return 1 << max(0, (need - 1).bit_length())
