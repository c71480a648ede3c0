"""Training attention for windows with blocks (text_history): the shared stream through SDPA's causal path, only the
blocks under a mask.

Why: a text_history window is a causal stream of titles with one `[<|next|> S(w_j)]` block per target that later
positions must not see (`windows.py`). Laid out in order, that needs a [L, L] mask over the whole window, and PyTorch's
CPU SDPA with a mask computes every (query, key) pair of the square, masked or not; with no mask and
`is_causal=True` it skips the upper triangle. Measured on one thread (Intel Xeon with AMX, bf16, a [21, 4, 900, 32]
batch like ML-1M's text_history, forward + backward, 2026-12-04): with the mask 301-329 ms, causal without one 200 ms.
So `windows.collate` (`split_blocks`) lays each window out as its stream first and its blocks after it, positions
unchanged, and this attention runs the stream as one causal SDPA and only the blocks' queries (a fifth of the
tokens) against every key under a [R, L] mask. Every token attends exactly the keys it attended in order, with the
same positions, so the losses equal the masked layout's up to float rounding (tests/test_windows.py).

The mask a batch carries says which layout it is in: None (plain causal windows), [B, 1, L, L] (the in-order
layout, `split_blocks=False`), or [B, 1, R, L] with R < L: the last R tokens are the blocks, the first L - R the
stream. It arrives additive, in the compute dtype (`additive_mask`), so SDPA does not convert it in every layer.
Causal windows without blocks that are short take plain matmuls instead (`EAGER_MAX_LEN`). Registered with
transformers' `AttentionInterface` as `NAME`; `windows.window_hidden` turns it on around the forward only,
so checkpoints, the engines and evaluation never see it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

NAME = "workbench_windows"
# Causal windows up to this many tokens (none, user_sid, soft_token: ~45-85 on ML-1M) attend through plain matmuls and
# a softmax instead of SDPA, whose CPU kernel has a fixed cost per (window, head) that short windows never amortize.
# Measured on one thread (Intel Xeon with AMX, bf16, 4 heads of 32, ~8k tokens per batch, forward + backward,
# 2026-12-04): eager / SDPA time 0.19 at 32 tokens, 0.27 at 64, 0.41 at 128, 1.23 at 256, 1.78 at 512; the ratio
# crosses 1 near 224 tokens (log-linear between 128 and 256), and 192 stays on the eager side of it. On ML-1M's
# `none` the training step took 0.75-0.80x SDPA's time. A shape rule, not a timing: the same windows take the same
# path on every CPU.
EAGER_MAX_LEN = 192
_registered = False


def windows_attention(module, query, key, value, attention_mask, scaling=None, dropout: float = 0.0, **kwargs):
    """transformers' attention-function contract: query [B, H, T, D], key / value [B, KV, T, D] -> ([B, T, H, D],
    None). Causal; `attention_mask` as in the module doc."""
    import torch
    import torch.nn.functional as F

    gqa = key.shape[1] != query.shape[1]
    T = query.shape[2]
    if attention_mask is None and T <= EAGER_MAX_LEN:
        return _eager_causal(query, key, value, scaling), None
    if attention_mask is None or attention_mask.shape[-2] == T:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                             is_causal=attention_mask is None, scale=scaling, enable_gqa=gqa)
    else:
        s = T - attention_mask.shape[-2]  # the stream: keys and queries 0 .. s-1, causal
        stream = F.scaled_dot_product_attention(query[:, :, :s], key[:, :, :s], value[:, :, :s], is_causal=True,
                                                scale=scaling, enable_gqa=gqa)
        blocks = F.scaled_dot_product_attention(query[:, :, s:], key, value, attn_mask=attention_mask, scale=scaling,
                                                enable_gqa=gqa)
        out = torch.cat([stream, blocks], dim=2)
    return out.transpose(1, 2).contiguous(), None


def _eager_causal(query, key, value, scaling):
    """Causal attention as matmuls and a float32 softmax: [B, H, T, D] -> [B, T, H, D]."""
    import torch

    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # each KV head serves `groups` query heads in a row, as SDPA's enable_gqa
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    T = query.shape[2]
    scores = (query @ key.transpose(-1, -2)) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=query.device).tril(), float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return (probs @ value).transpose(1, 2).contiguous()


def additive_mask(mask, dtype):
    """A bool mask (True: visible) as 0 / -inf in `dtype`, or None."""
    import torch

    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))


@contextlib.contextmanager
def windows_attention_on(model) -> Iterator[None]:
    """`model` (a transformers causal LM) runs `windows_attention` inside the block, its own attention after it."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, windows_attention)
        _registered = True
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
