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
"""

from __future__ import annotations

import torch  # (this module is imported only where training runs: torch is loaded there anyway)

# 256 x 4,198 float32 logits = 4.3 MB per chunk. The loss above (4,100 rows, bf16, forward + backward, one thread)
# took 89 / 76 / 74 / 86 ms at 128 / 256 / 512 / 1,024 rows per chunk (Intel Xeon with AMX, 2026-12-04)
CHUNK_ROWS = 256


def chunked_lm_loss(hidden, weight, targets, dtype):
    """Mean cross-entropy of `hidden` [n, H] against the LM head `weight` [V, H] (no bias) for `targets` [n], the
    logits computed in `dtype` and reduced in float32. Gradients flow to `hidden` and `weight`."""
    return ChunkedLMLoss.apply(hidden, weight, targets, dtype)


class ChunkedLMLoss(torch.autograd.Function):
    """The loss of `chunked_lm_loss`; backward computes each chunk's logits again instead of keeping them."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, dtype):
        h, w = hidden.to(dtype), weight.to(dtype)
        n = h.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        for s in range(0, n, CHUNK_ROWS):
            logits = (h[s : s + CHUNK_ROWS] @ w.T).float()
            lse[s : s + CHUNK_ROWS] = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, targets[s : s + CHUNK_ROWS, None]).squeeze(1)
            total += (lse[s : s + CHUNK_ROWS] - picked).sum(dtype=torch.float64)
        ctx.save_for_backward(h, w, targets, lse)
        ctx.hidden_dtype, ctx.weight_dtype = hidden.dtype, weight.dtype
        return (total / max(n, 1)).float()

    @staticmethod
    def backward(ctx, grad):
        h, w, targets, lse = ctx.saved_tensors
        n = h.shape[0]
        scale = grad.float() / max(n, 1)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
        rows = torch.arange(min(n, CHUNK_ROWS), device=h.device)
        for s in range(0, n, CHUNK_ROWS):
            hs = h[s : s + CHUNK_ROWS]
            p = (hs @ w.T).float().sub_(lse[s : s + CHUNK_ROWS, None]).exp_()  # softmax
            p[rows[: len(hs)], targets[s : s + CHUNK_ROWS]] -= 1.0
            g = p.mul_(scale).to(h.dtype)
            grad_h[s : s + CHUNK_ROWS] = g @ w
            grad_w += (g.T @ hs).float()
        return grad_h.to(ctx.hidden_dtype), grad_w.to(ctx.weight_dtype), None, None
