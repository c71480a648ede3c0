"""Helpers for tests and benchmarks: small random checkpoints in the real checkpoint format.

The engines are judged on exactness and speed, not on recommendations, so a random model is
enough. `make_random_checkpoint` writes a complete checkpoint (HF dir + tokenizer + projector +
catalog + workbench.json) for a tiny Qwen3 or Llama config. Its output layer is scaled by
`peak` so that next-token distributions are peaked and beam order is never decided by ties at
1e-6; its other weights use a larger init than HF's default so outputs depend on the context
(a model that ignores its prompt would make parity and soft-token tests pass vacuously).

No pytest import at module top: the benchmark uses this module too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.model.checkpoint import CheckpointMeta, save_checkpoint
from workbench.sids.layout import SidLayout, add_dedup_digit


def make_word_tokenizer(layout: SidLayout):
    """A word-level HF tokenizer: `[UNK]`, `[PAD]`, `w2`..`w{base-1}`, then every layout token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = ["[UNK]", "[PAD]"] + [f"w{i}" for i in range(2, layout.base_vocab_size)]
    vocab = {t: i for i, t in enumerate(base[: layout.base_vocab_size])}
    for j, name in enumerate(layout.token_names()):
        vocab[name] = layout.base_vocab_size + j
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    fast.add_tokens(layout.token_names(), special_tokens=False)  # so "<a_1><b_2>" splits without spaces
    return fast


def random_item_codes(n_items: int, levels, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Random codes for `n_items` with the dedup digit appended; returns (codes, dedup_size)."""
    codes = np.stack([rng.integers(0, int(k), size=n_items) for k in levels], axis=1)
    codes = add_dedup_digit(codes)
    return codes, int(codes[:, -1].max()) + 1


def small_config(arch: str, vocab_size: int, hidden_size: int = 64, num_layers: int = 2,
                 max_position_embeddings: int = 1024, **kw):
    """A small Qwen3 or Llama config (GQA: half as many KV heads as query heads)."""
    heads = kw.pop("num_attention_heads", max(2, hidden_size // 16))
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=kw.pop("intermediate_size", hidden_size * 3),
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kw.pop("num_key_value_heads", max(1, heads // 2)),
        head_dim=kw.pop("head_dim", hidden_size // heads),
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=kw.pop("initializer_range", 0.1),
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=1,
    )
    common.update(kw)
    if arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common)
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    raise ValueError(f"unknown arch {arch!r}; use 'qwen3' or 'llama'")


def make_random_checkpoint(path, arch: str = "qwen3", n_items: int = 200, levels=(8, 8), hidden_size=64,
                           num_layers=2, vocab_base=300, peak: float = 8.0, soft_token: bool = True,
                           seed: int = 0, max_position_embeddings=1024, **kw) -> Path:
    """Write a random small checkpoint to `path` and return it (see module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    from workbench.model.projector import SoftTokenProjector

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    user_dim = int(kw.pop("user_vector_dim", 16))
    projector_kind = kw.pop("projector_kind", "linear")
    codes, dedup = random_item_codes(n_items, levels, rng)
    layout = SidLayout(base_vocab_size=vocab_base, item_codebooks=tuple(int(k) for k in levels), dedup_size=dedup,
                       user_codebooks=tuple(kw.pop("user_codebooks", (4, 4))))
    config = small_config(arch, layout.vocab_size, hidden_size, num_layers, max_position_embeddings, **kw)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        # Peaked outputs: logits ~ N(0, peak^2) for a unit-RMS final hidden state.
        w = model.lm_head.weight
        w.copy_(torch.randn_like(w) * (peak / hidden_size**0.5))
        emb = model.get_input_embeddings().weight
        emb.copy_(torch.randn_like(emb))
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    projector = None
    if soft_token:
        projector = SoftTokenProjector(user_dim, hidden_size, projector_kind)
        with torch.no_grad():
            for p in projector.parameters():
                p.normal_(0.0, 1.0 / user_dim**0.5)
    meta = CheckpointMeta(
        method="soft_token" if soft_token else "none",
        layout=layout,
        sid_version=f"random-seed{seed}",
        backbone=f"random-{arch}",
        prompt_template="random tokens; <|user|> placeholder where given",
        user_vector_dim=user_dim if soft_token else None,
        extra={"testing": True, "peak": peak},
    )
    return save_checkpoint(path, model, make_word_tokenizer(layout), meta, codes, projector)


def random_prompt_ids(n_tokens: int, vocab_base: int, rng: np.random.Generator) -> list[int]:
    """Random base-vocabulary token ids (never the specials 0/1)."""
    return rng.integers(2, vocab_base, size=n_tokens).tolist()


# The smallest real personalization study (ML-100K, collaborative SIDs, a 1-layer model, `none` + `soft_token`,
# one short epoch, 30 test users): overrides on top of experiments/quickstart.yaml, shared by the tests that
# train and evaluate through the real pipeline (notebook 02, load tests on trained checkpoints).
TINY_STUDY_OVERRIDES: dict = {
    "semantic_ids": {"item_vectors": "collab", "also_fit": [], "levels": 2, "codebook_size": 16},
    "user_sids": {"levels": 1, "codebook_size": 8},
    "embeddings": {"als_factors": 16, "als_iterations": 3},
    "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
              "intermediate_size": 64, "bpe_vocab_size": 500},
    "training": {"epochs": 1, "targets_per_user": 1, "valid_users": 30, "batch_size": 64, "num_threads": 1},
    "methods": {"run": ["none", "soft_token"], "recent_k": 3, "long_m": 5},
    "evaluation": {"test_users": 30, "bootstrap": 50, "sasrec_epochs": 1, "validity_users": 5,
                   "latency_requests": 2, "rerank_top": 30},
}  # fmt: skip
