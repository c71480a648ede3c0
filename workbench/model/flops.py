"""FLOPs of a decoder LM's training and inference, counted piece by piece.

Replaces `6 x n_params x tokens`, which counts the (tied) embedding matrix as a matmul at every
token: the input embedding is a gather (no FLOPs), and the LM head costs 2 x hidden x vocab only
on the rows whose logits are read (the loss or score positions), over the vocab columns actually
computed. With a small backbone and a large SID vocabulary that term was ~half the total, so
training FLOPs were ~2x overstated.

Pieces (one multiply-add = 2 FLOPs; forward only unless said):
- `matmul_flops_per_token`: 2 x the weights of every decoder layer's linear maps (q, k, v, o,
  gate, up, down). Biases, norms, RoPE, softmax and activations are elementwise and left out.
- `attention_flops`: QK^T and AV, 4 x layers x query heads x head_dim per (query, key) pair.
  A causal kernel that skips the masked half does `causal_pairs(T)` pairs; SDPA/FlashAttention
  counters (and dense kernels) charge the full T x T square.
- `lm_head_flops`: 2 x hidden x vocab_rows per logit row.
- `train_flops`: 3 x forward (the backward pass costs ~2x the forward: grads of inputs and weights).
- `beam_request_flops`, `score_request_flops`: one serving request by phase, from the pieces above (the floor
  benchmark and the GPU probe divide them by a measured GEMM rate: the compute floor of a request).

`config` is a transformers config (Qwen3Config, LlamaConfig): hidden_size, intermediate_size,
num_hidden_layers, num_attention_heads, num_key_value_heads and head_dim (hidden/heads if absent).
Checked against `torch.utils.flop_counter.FlopCounterMode` on a tiny Qwen3 in tests/test_flops.py.
"""

from __future__ import annotations

from typing import Any


def _head_dim(config: Any) -> int:
    hd = getattr(config, "head_dim", None)
    return int(hd) if hd else config.hidden_size // config.num_attention_heads


def linear_params_per_layer(config: Any) -> int:
    """Weights of one decoder layer's q, k, v, o, gate, up and down projections."""
    h, i, d = config.hidden_size, config.intermediate_size, _head_dim(config)
    q_dim = config.num_attention_heads * d
    kv_dim = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    kv_dim *= d
    attn = h * q_dim + 2 * h * kv_dim + q_dim * h  # q, k, v, o
    mlp = 3 * h * i  # gate, up, down
    return attn + mlp


def matmul_flops_per_token(config: Any) -> float:
    """Forward FLOPs of one token through the decoder layers' linear maps (no embedding, no head)."""
    return 2.0 * config.num_hidden_layers * linear_params_per_layer(config)


def attention_flops(config: Any, n_query_tokens: float, context: float) -> float:
    """Forward QK^T + AV FLOPs of n_query_tokens queries, each attending `context` keys (a mean)."""
    per_pair = 4.0 * config.num_hidden_layers * config.num_attention_heads * _head_dim(config)
    return per_pair * n_query_tokens * context


def causal_pairs(seq_len: int) -> int:
    """(query, key) pairs of one causal sequence: query t attends keys 0..t."""
    return seq_len * (seq_len + 1) // 2


def lm_head_flops(config: Any, n_logit_rows: float, vocab_rows: int | None = None) -> float:
    """Forward LM-head FLOPs: n_logit_rows hidden rows times `vocab_rows` (default: all) columns."""
    v = config.vocab_size if vocab_rows is None else vocab_rows
    return 2.0 * config.hidden_size * v * n_logit_rows


def forward_flops(config: Any, tokens: float, logit_rows: float, vocab_rows: int | None, attended_keys: float) -> float:
    """One forward: `tokens` through the layers, `attended_keys` (query, key) pairs in total,
    logits on `logit_rows` rows over `vocab_rows` columns."""
    return (
        matmul_flops_per_token(config) * tokens
        + attention_flops(config, 1, attended_keys)  # one "query" attending the total pair count
        + lm_head_flops(config, logit_rows, vocab_rows)
    )


def train_flops(config: Any, tokens: float, logit_rows: float, vocab_rows: int | None, attended_keys: float) -> float:
    """Training FLOPs = 3 x forward (backward ~2 x forward); arguments as in `forward_flops`.

    attended_keys: total (query, key) pairs over all tokens, e.g. sum of `causal_pairs(len)` over
    the batch's sequences (or len**2 each if the kernel computes the full square).
    """
    return 3.0 * forward_flops(config, tokens, logit_rows, vocab_rows, attended_keys)


def beam_request_flops(config: Any, prompt: int, beam: int, new_tokens: int) -> dict[str, float]:
    """Forward FLOPs of one beam-search request by phase: the prompt's causal prefill, then `new_tokens - 1` decode
    steps of `beam` rows, step t's rows attending to the prompt and their t tokens so far; logits for the prompt's
    last row and for every decode row (the first token comes from the prefill's logits)."""
    steps = new_tokens - 1
    per_token = matmul_flops_per_token(config)
    return {
        "prefill_gemm": per_token * prompt,
        "prefill_attention": attention_flops(config, 1, causal_pairs(prompt)),
        "decode_gemm": per_token * beam * steps,
        "decode_attention": sum(attention_flops(config, beam, prompt + t) for t in range(1, new_tokens)),
        "lm_head": lm_head_flops(config, 1 + beam * steps),
    }


def score_request_flops(config: Any, prompt: int, candidates: int, candidate_tokens: int) -> dict[str, float]:
    """Forward FLOPs of one multi-item scoring request (sequence mode) by phase: the prompt's causal prefill, then
    every candidate's tokens in one pass, token i attending to the prompt and the candidate's first i tokens; logits
    for the prompt's last row and each candidate's rows but its last (the rows that predict a next token)."""
    rows = candidates * candidate_tokens
    return {
        "prefill_gemm": matmul_flops_per_token(config) * prompt,
        "prefill_attention": attention_flops(config, 1, causal_pairs(prompt)),
        "candidate_gemm": matmul_flops_per_token(config) * rows,
        "candidate_attention": attention_flops(config, candidates, prompt * candidate_tokens
                                               + causal_pairs(candidate_tokens)),
        "lm_head": lm_head_flops(config, 1 + candidates * (candidate_tokens - 1)),
    }
