"""Random models built in memory (`random_checkpoint.random_model`): the seeds' Qwen3-1.7B shape counted on the
meta device (no memory), small ones live on the CPU in the dtype asked for, and the 1.7B never sent to disk."""

from __future__ import annotations

import asyncio

import pytest

from workbench.errors import UsageError
from workbench.model.random_checkpoint import SIZES, random_model, random_size

torch = pytest.importorskip("torch")


def qwen3_1_7b_parameters() -> int:
    """Qwen3-1.7B's parameter count from its published config shape, by hand: hidden 2048, 28 layers, 16 query /
    8 KV heads of 128, MLP 6144, vocabulary 151,936, tied embeddings (one matrix), q/k RMSNorm per head."""
    h, layers, heads, kv_heads, d, mlp, vocab = 2048, 28, 16, 8, 128, 6144, 151_936
    attention = h * heads * d + 2 * h * kv_heads * d + heads * d * h  # q, k, v, o
    norms = 2 * d + 2 * h  # q_norm, k_norm; input and post-attention RMSNorm
    per_layer = attention + 3 * h * mlp + norms
    return vocab * h + layers * per_layer + h  # embedding (= output layer), the layers, the final norm


def test_1_7b_on_meta_has_the_parameter_count_of_qwen3_1_7b():
    want = qwen3_1_7b_parameters()
    assert want == 1_720_574_976  # "1.7B"; outside the embedding 1,409,410,048 ("1.4B" non-embedding)
    ck = random_model("1.7b", device="meta", dtype="bfloat16", soft_token=False, levels=(16, 16, 16, 16),
                      n_items=2000)
    model = ck.model
    assert sum(p.numel() for p in model.parameters()) == want
    assert {p.device.type for p in model.parameters()} == {"meta"} and model.dtype == torch.bfloat16
    cfg = model.config
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied: one matrix
    assert (cfg.vocab_size, cfg.head_dim, cfg.rope_parameters["rope_theta"]) == (151_936, 128, 1e6)
    assert ck.path is None and ck.catalog.depth == 5 and ck.meta.layout.vocab_size < cfg.vocab_size


def test_1_7b_is_never_written_to_disk():
    assert not SIZES["1.7b"].on_disk and all(s.on_disk for n, s in SIZES.items() if n != "1.7b")
    with pytest.raises(UsageError, match="built in memory"):
        random_size("1.7b", for_disk=True)
    with pytest.raises(UsageError, match="built in memory"):
        SIZES["1.7b"].checkpoint_kwargs()
    assert random_size("1.7b") is SIZES["1.7b"]  # in memory it is an ordinary size
    from workbench.config import ConfigError, LoadConfig
    from workbench.load.sources import resolve_checkpoint

    with pytest.raises(ConfigError, match="load.checkpoints: random size 1.7b is built in memory"):
        resolve_checkpoint("random:1.7b", LoadConfig(checkpoints=["random:1.7b"], prompt_tokens=16))


def test_a_small_model_in_memory_serves_in_the_dtype_asked():
    from workbench.engines.base import BeamSearchRequest
    from workbench.engines.registry import create_engine
    from workbench.engines.workloads import SyntheticWorkload, WorkloadShape

    ck = random_model("0.1m", dtype="bfloat16", vocab_size=600, tie_word_embeddings=True, n_items=50,
                      levels=(4, 4))
    assert ck.model.dtype == torch.bfloat16 and ck.model.config.vocab_size == 600
    eng = create_engine("torch", ck, dtype="bfloat16")
    try:
        shape = WorkloadShape("beam_search", prompt_tokens=12, beam_width=4, max_new_tokens=3, constrained=True)
        req = SyntheticWorkload.from_checkpoint(shape, ck).request(0)
        assert req.prompt.is_soft  # the checkpoint has a projector: the workload follows it
        (res,) = asyncio.run(eng.beam_search([BeamSearchRequest(req.prompt, 4, 3, constrained=True)]))
        assert res.success, res.error
        assert all(ck.catalog.item_of(b.token_ids) is not None for b in res.beams)
    finally:
        eng.shutdown()
