"""The training loss over the full vocabulary, computed in row chunks without keeping the logits.

Why: every step reads the loss at n = targets x SID depth positions (~4,100 on ML-1M at 1,024 targets) over the
whole vocabulary (4,198 tokens there): a [n, V] logit matrix of ~17M entries that the plain path materializes in
bf16, copies to float32, log-softmaxes, keeps for backward and then turns into a float32 gradient, a bf16 copy and
a matmul: each pass a fresh ~70 MB tensor. Profiled on ML-1M's `none` (Intel Xeon with AMX, one thread, bf16,
2026-12-04, `workbench trainbench`): log-softmax and NLL forward + backward 49 ms, casts 44 ms and zero fills 15 ms of
a 375 ms step (not every cast is the logits'); the LM-head matmuls are ~3% of it at the measured matmul rate. The loss
alone on those shapes, forward + backward: 114 ms as kept logits, 75 ms chunked.

Here the loss goes through `chunked_lm_loss`: for each chunk of `CHUNK_ROWS` rows the logits are computed, reduced
to their log-sum-exp and the target's logit, and dropped; backward computes each chunk's logits again (one more
LM-head matmul, ~1% of a step at that rate) and turns them into that chunk's gradients while they are still in
cache. The function is the same: mean over rows of logsumexp(h W^T) - (h W^T)[target], logits in `dtype` (bf16 under the
training's autocast, as the plain path's LM head) and reduced in float32, so the loss and gradients equal the
plain path's up to rounding (tests/test_lm_loss.py derives the bounds).

`fused` (`training.loss: fused`, the default, and SASRec's): the same chunks, the same matmuls, but each chunk's
elementwise work (the float32 copy of the logits, log-sum-exp and the target's logit forward; exp, the -1 at the target,
the scale and the cast back to the compute dtype backward) runs as one `torch.compile`d kernel instead of five to seven
passes over a 4 MB chunk. The kernels are `chunk_stats` and `chunk_grad` below, the same Python functions the eager
path calls, so the two compute the same function; only the order of float32 sums may differ. Measured with the loss
alone, forward + backward, one thread (AMD EPYC Zen 4, 2026-12-05; `tests/test_lm_loss.py` checks the equality):
ML-1M's none shape (4,100 rows, 4,198 tokens, hidden 128, bf16) 156-169 -> 118-124 ms; SASRec's (3,200 rows, 3,706
items, hidden 64, float32) 114-120 -> 95-96 ms; the quickstart's (2,048 x 2,000 x 64, bf16) 27.5 -> 20.5 ms. The
kernels compile once per process (~9 s cold; inductor's on-disk cache makes later processes ~1-2 s). Only on the
CPU: elsewhere `fused` runs the eager kernels.
"""

from __future__ import annotations

import torch  # (this module is imported only where training runs: torch is loaded there anyway)

# 256 x 4,198 float32 logits = 4.3 MB per chunk. The loss above (4,100 rows, bf16, forward + backward, one thread)
# took 89 / 76 / 74 / 86 ms at 128 / 256 / 512 / 1,024 rows per chunk (Intel Xeon with AMX, 2026-12-04)
CHUNK_ROWS = 256


def chunked_lm_loss(hidden, weight, targets, dtype, fused: bool = False):
    """Mean cross-entropy of `hidden` [n, H] against the LM head `weight` [V, H] (no bias) for `targets` [n], the
    logits computed in `dtype` and reduced in float32. Gradients flow to `hidden` and `weight`. `fused`: each
    chunk's elementwise work as one compiled kernel (the module doc)."""
    return ChunkedLMLoss.apply(hidden, weight, targets, dtype, fused)


def chunk_stats(logits, targets):
    """One chunk's log-sum-exp [rows] (float32) and its rows' summed loss (float64)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    return lse, (lse - x.gather(1, targets[:, None]).squeeze(1)).sum(dtype=torch.float64)


def chunk_grad(logits, lse, targets, scale):
    """One chunk's gradient of `scale` x its summed loss with respect to its logits: (softmax - onehot) x scale,
    in the logits' dtype. `torch.sub` promotes a bf16 chunk to float32 in the same pass."""
    p = torch.sub(logits, lse[:, None]).exp_()
    p[torch.arange(p.shape[0], device=p.device), targets] -= 1.0
    return p.mul_(scale).to(logits.dtype)


_COMPILED: dict[str, object] = {}


def _kernels(fused: bool, device) -> tuple:
    """(stats, grad): the eager functions, or (fused, on the CPU) their compiled kernels, compiled on first use."""
    if not fused or torch.device(device).type != "cpu":
        return chunk_stats, chunk_grad
    if not _COMPILED:  # dynamic: the last chunk is shorter, and SASRec and the models differ in vocabulary and width
        _COMPILED["stats"] = torch.compile(chunk_stats, dynamic=True)
        _COMPILED["grad"] = torch.compile(chunk_grad, dynamic=True)
    return _COMPILED["stats"], _COMPILED["grad"]


class ChunkedLMLoss(torch.autograd.Function):
    """The loss of `chunked_lm_loss`; backward computes each chunk's logits again instead of keeping them."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, dtype, fused):
        h, w = hidden.to(dtype), weight.to(dtype)
        stats, _ = _kernels(fused, h.device)
        n = h.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        for s in range(0, n, CHUNK_ROWS):
            lse[s : s + CHUNK_ROWS], part = stats(h[s : s + CHUNK_ROWS] @ w.T, targets[s : s + CHUNK_ROWS])
            total += part
        ctx.save_for_backward(h, w, targets, lse)
        ctx.hidden_dtype, ctx.weight_dtype, ctx.fused = hidden.dtype, weight.dtype, fused
        return (total / max(n, 1)).float()

    @staticmethod
    def backward(ctx, grad):
        h, w, targets, lse = ctx.saved_tensors
        _, grad_of = _kernels(ctx.fused, h.device)
        n = h.shape[0]
        scale = grad.float() / max(n, 1)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
        for s in range(0, n, CHUNK_ROWS):
            hs = h[s : s + CHUNK_ROWS]
            g = grad_of(hs @ w.T, lse[s : s + CHUNK_ROWS], targets[s : s + CHUNK_ROWS], scale)
            grad_h[s : s + CHUNK_ROWS] = g @ w
            grad_w += (g.T @ hs).float()
        return grad_h.to(ctx.hidden_dtype), grad_w.to(ctx.weight_dtype), None, None, None
