"""The soft-token projector (Embedding-to-Prefix): a user vector -> one row of the LM's embedding space.

The soft-token method replaces the embedding of the `<|user|>` placeholder with
`projector(user_vector)` before the first forward pass. The projector is trained with the LM
(train.py), saved next to it in the checkpoint (`projector.safetensors`, see checkpoint.py) and
applied *inside* every engine that supports soft tokens, so a client only ever sends the raw
vector.

Two shapes: "linear" (one affine map) and "mlp" (affine -> GELU -> affine). Both map
`[B, in_dim] -> [B, hidden_size]`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

PROJECTOR_KINDS = ("linear", "mlp")


class SoftTokenProjector(nn.Module):
    """Map a user vector to one embedding row of width `hidden_size`."""

    def __init__(self, in_dim: int, hidden_size: int, kind: str = "linear"):
        super().__init__()
        if kind not in PROJECTOR_KINDS:
            raise ValueError(f"unknown projector kind {kind!r}; use one of {PROJECTOR_KINDS}")
        if in_dim < 1 or hidden_size < 1:
            raise ValueError(f"projector dims must be positive, got in_dim={in_dim}, hidden_size={hidden_size}")
        self.in_dim = int(in_dim)
        self.hidden_size = int(hidden_size)
        self.kind = kind
        if kind == "linear":
            self.net = nn.Linear(in_dim, hidden_size)
        else:
            self.net = nn.Sequential(nn.Linear(in_dim, hidden_size), nn.GELU(), nn.Linear(hidden_size, hidden_size))

    def forward(self, vec: Tensor) -> Tensor:
        # [B, in_dim] -> [B, hidden_size]
        if vec.shape[-1] != self.in_dim:
            raise ValueError(f"user vector has {vec.shape[-1]} values; this projector expects {self.in_dim}")
        return self.net(vec)

    def config(self) -> dict:
        return {"in_dim": self.in_dim, "hidden_size": self.hidden_size, "kind": self.kind}

    @classmethod
    def from_config(cls, cfg: dict) -> "SoftTokenProjector":
        return cls(int(cfg["in_dim"]), int(cfg["hidden_size"]), str(cfg.get("kind", "linear")))

    def extra_repr(self) -> str:
        return f"kind={self.kind}"


def project(projector: SoftTokenProjector, vectors: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Run the projector in its own dtype and return rows in `dtype` (the LM's embedding dtype)."""
    p = next(projector.parameters())
    out = projector(vectors.to(device=p.device, dtype=p.dtype))
    return out if dtype is None else out.to(dtype)
