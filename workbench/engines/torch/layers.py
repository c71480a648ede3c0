"""The pieces every layer of the torch engine's forward is built from, shared by the model and its variants.

Kept below model.py (and so below the variants, which model.py calls at load) so that the variants take them
from here, not from the model that imports them: the RMSNorm, the GEMM wrappers with their batch-invariance
padding (MIN_ROWS, BLOCK_ROWS), the three elementwise ops between a layer's GEMMs and its attention
(`LayerOps`: eager here, compiled by fused.py), which of their arguments are per token row (ROW_ARGS), and a
layer's weights (`LayerWeights`) with the one way to swap its GEMMs for another kernel (int8.py, onednn.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    dt = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(dt)


# Batch invariance: BLAS picks kernels, blocking and the thread split by the number of rows M
# (1-2 rows even take a gemv path), so a row's rounding can depend on its batch mates. Tiny
# batches are always padded to MIN_ROWS. With one thread that is enough (rows then match to
# ~1e-6 alone vs batched); with several threads the split itself depends on M, so the engine's
# `batch_invariant=True` runs every GEMM in fixed blocks of BLOCK_ROWS rows. That is opt-in: it
# pads a 30-row decode step to 256 rows (measured 1.9x slower per request on a 25M model).
MIN_ROWS = 4
BLOCK_ROWS = 256


def matmul(x: Tensor, w, b: Tensor | None = None) -> Tensor:
    """x @ w.T + b: F.linear, or the weight's own kernel when it is a quantized one (a callable such
    as int8.Int8Linear, whose bias is packed with it)."""
    return F.linear(x, w, b) if isinstance(w, Tensor) else w(x)


def linear(x: Tensor, w, b: Tensor | None = None, blocked: bool = False) -> Tensor:
    n = x.shape[0]
    if blocked and n > MIN_ROWS:
        pad = (-n) % BLOCK_ROWS
        xp = F.pad(x, (0, 0, 0, pad)) if pad else x
        return torch.cat([matmul(blk, w, b) for blk in xp.split(BLOCK_ROWS)])[:n]
    if n >= MIN_ROWS:
        return matmul(x, w, b)
    return matmul(F.pad(x, (0, 0, 0, MIN_ROWS - n)), w, b)[:n]


def swap_halves(x: Tensor) -> Tensor:
    """[x1 | x2] -> [x2 | x1] on the last dim: HF's rotate_half, [-x2 | x1], with the sign left to `FastLM.rope`'s sin."""
    h = x.shape[-1] // 2
    return torch.cat((x[..., h:], x[..., :h]), dim=-1)


# ---- the elementwise work of a layer: pure functions, so torch.compile can fuse each (fused.py) ----
def qk_norm_rope(qk: Tensor, qk_norm: Tensor | None, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
    """qk [N, H + Hkv, D] (the q and k heads of the qkv GEMM's output, one view) -> RoPE(q/k-norm(qk)).

    q and k in one pass: `qk_norm` [H + Hkv, D] holds the q-norm weight for each query head and the k-norm
    weight for each KV head (`LayerWeights.qk_norm`), so each op runs once per layer, not twice (half the ops of
    a 30-row decode step's norm and RoPE), on the same values: the norm reduces over D per head either way.
    `sin` is `FastLM.rope`'s, its first half negated, so HF's q * cos + rotate_half(q) * sin is q * cos +
    swap_halves(q) * sin here: one op less (rotate_half's negation), the same results bit for bit
    ((-a) * b == a * (-b) in IEEE arithmetic)."""
    if qk_norm is not None:
        qk = rms_norm(qk, qk_norm, eps)
    return qk * cos + swap_halves(qk) * sin


def add_norm(x: Tensor, y: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The residual add and the next RMSNorm: (x + y, rms_norm(x + y))."""
    x = x + y
    return x, rms_norm(x, w, eps)


def silu_mul(gu: Tensor) -> Tensor:
    """[N, 2 I] gate|up rows -> silu(gate) * up [N, I]."""
    inter = gu.shape[-1] // 2
    return F.silu(gu[:, :inter]) * gu[:, inter:]


class LayerOps(NamedTuple):
    """The elementwise work between a layer's GEMMs and its attention: eager, or compiled (fused.py)."""

    qk_norm_rope: Callable[..., Tensor]
    add_norm: Callable[..., tuple[Tensor, Tensor]]
    silu_mul: Callable[[Tensor], Tensor]


EAGER_OPS = LayerOps(qk_norm_rope, add_norm, silu_mul)
# Which arguments of each op have one entry per token row (the dimension that varies between forwards; the
# others are weights and eps): fused.py marks exactly these dynamic.
ROW_ARGS = LayerOps((0, 2, 3), (0, 1), (0,))


@dataclass
class LayerWeights:
    ln1: Tensor
    # the GEMM weights are Tensors, or int8.Int8Linear (bias packed in, b* None) with quantize="int8"
    wqkv: Tensor  # [(H + 2 Hkv) D, hidden]
    bqkv: Tensor | None
    qk_norm: Tensor | None  # [H + Hkv, D]: the q-norm weight per query head, then the k-norm weight per KV head
    wo: Tensor
    bo: Tensor | None
    ln2: Tensor
    w_gate_up: Tensor  # [2 I, hidden]
    w_down: Tensor


def replace_layer_gemms(layers: list[LayerWeights], make: Callable) -> None:
    """Replace every layer's GEMM weights (qkv, o, gate_up, down) by `make(weight, bias)`, a callable computing
    x @ weight.T + bias with its own kernel (int8, oneDNN); the biases go into it (b* become None)."""
    for lw in layers:
        lw.wqkv, lw.bqkv = make(lw.wqkv, lw.bqkv), None
        lw.wo, lw.bo = make(lw.wo, lw.bo), None
        lw.w_gate_up = make(lw.w_gate_up, None)
        lw.w_down = make(lw.w_down, None)

