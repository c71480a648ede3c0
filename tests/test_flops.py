"""FLOP counts: hand arithmetic on a tiny config, and torch's FlopCounterMode on a real tiny Qwen3.

FlopCounterMode counts only matmul-like aten ops (mm, addmm, bmm, baddbmm, conv and the fused
attention kernels it registers): no embedding gather, norms, RoPE, softmax or SiLU, which is what
`workbench.model.flops` counts too. On CPU, SDPA's default kernel
(`_scaled_dot_product_flash_attention_for_cpu`) is not in its registry (torch 2.13), so attention
would read as 0; the math backend decomposes SDPA into two bmm's that it does count (the full
T x T square: masking does not remove work).
"""

from __future__ import annotations

import pytest

from workbench.model import flops as F

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _tiny():
    # hidden 64, MLP 192, 2 layers, 4 query heads and 2 KV heads of dim 32 (q dim 128 != hidden), vocab 1000
    return transformers.Qwen3Config(
        vocab_size=1000, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, tie_word_embeddings=True, attn_implementation="sdpa",
    )


def test_hand_arithmetic():
    cfg = _tiny()
    # per layer: q 64x128 = 8192, k 64x64 = 4096, v 4096, o 128x64 = 8192 -> 24576
    #            gate 64x192 = 12288, up 12288, down 12288             -> 36864; layer total 61440
    assert F.linear_params_per_layer(cfg) == 61440
    assert F.matmul_flops_per_token(cfg) == 2 * 2 * 61440 == 245760  # 2 FLOPs x 2 layers x weights
    # attention: 4 x 2 layers x 4 heads x 32 = 1024 FLOPs per (query, key); 10 queries x 7 keys
    assert F.attention_flops(cfg, 10, 7) == 1024 * 70 == 71680
    assert F.causal_pairs(4) == 1 + 2 + 3 + 4
    # head: 2 x 64 x 1000 = 128000 per row; over 32 SID columns 2 x 64 x 32 = 4096 per row
    assert F.lm_head_flops(cfg, 3) == 3 * 128000
    assert F.lm_head_flops(cfg, 3, vocab_rows=32) == 3 * 4096
    # training: 100 tokens in sequences of 10 (causal), loss on 20 rows over 32 columns
    fwd = 245760 * 100 + 1024 * 10 * F.causal_pairs(10) + 4096 * 20
    assert F.forward_flops(cfg, 100, 20, 32, 10 * 55) == fwd == 25_221_120
    assert F.train_flops(cfg, 100, 20, 32, 10 * 55) == 3 * fwd
    # the old 6 x params x tokens counted the tied 64,000-weight embedding at all 100 tokens (and
    # over the whole vocab): 1.48x here; the ratio grows with vocab / hidden and tokens / loss rows
    n_params = 2 * 61440 + 64 * 1000
    assert 6 * n_params * 100 / F.train_flops(cfg, 100, 20, 32, 10 * 55) == pytest.approx(1.482, abs=0.001)


def _measured(model, run) -> dict[str, int]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        run(model)
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def test_forward_matches_flop_counter():
    cfg = _tiny()
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    b, t = 2, 24
    ids = torch.randint(0, cfg.vocab_size, (b, t))
    with torch.no_grad():
        every = _measured(model, lambda m: m(input_ids=ids))  # logits on every row
        last = _measured(model, lambda m: m(input_ids=ids, logits_to_keep=1))  # one logit row per sequence
    # SDPA computes the full t x t square per sequence
    pred_every = F.forward_flops(cfg, b * t, b * t, None, b * t * t)
    pred_last = F.forward_flops(cfg, b * t, b, None, b * t * t)
    assert sum(every.values()) == pytest.approx(pred_every, rel=0.02)
    assert sum(last.values()) == pytest.approx(pred_last, rel=0.02)
    assert every["aten.bmm"] == pytest.approx(F.attention_flops(cfg, b * t, t), rel=0.02)


def test_training_step_is_three_forwards():
    cfg = _tiny()
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).train()
    b, t = 2, 16
    ids = torch.randint(0, cfg.vocab_size, (b, t))

    def step(m):
        m(input_ids=ids, labels=ids).loss.backward()

    got = sum(_measured(model, step).values())
    assert got == pytest.approx(F.train_flops(cfg, b * t, b * t, None, b * t * t), rel=0.02)


def test_request_flops_by_phase_by_hand():
    """One beam request and one scoring request on the tiny config (245,760 matmul FLOPs per token, 1,024 per
    query-key pair, 128,000 per logit row), every phase counted by hand."""
    cfg = _tiny()
    beam = F.beam_request_flops(cfg, prompt=10, beam=2, new_tokens=3)
    assert beam == {"prefill_gemm": 245760 * 10, "prefill_attention": 1024 * 55,  # 10 x 11 / 2 causal pairs
                    "decode_gemm": 245760 * 2 * 2,  # 2 beams x 2 decode steps
                    "decode_attention": 1024 * 2 * (11 + 12),  # step t: 10 prompt keys + t own
                    "lm_head": 128000 * (1 + 2 * 2)}  # the prompt's last row + every decode row
    score = F.score_request_flops(cfg, prompt=10, candidates=3, candidate_tokens=4)
    assert score == {"prefill_gemm": 245760 * 10, "prefill_attention": 1024 * 55,
                     "candidate_gemm": 245760 * 12,  # 3 candidates x 4 tokens
                     "candidate_attention": 1024 * 3 * (11 + 12 + 13 + 14),  # token i: 10 prompt keys + i own
                     "lm_head": 128000 * (1 + 3 * 3)}  # the prompt's last row + each candidate's first 3 rows
