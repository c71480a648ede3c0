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
SID layout of the catalog built with it. `SIZES` gives both. One size copies a real model instead and is named
after it: "1.7b", the shape of the seeds' Qwen3-1.7B (its padded 151,936-row vocabulary, tied embeddings,
rope theta 1e6: 1.72B parameters in all, 1.41B of them outside the embedding).

That one is never written to disk: `random_model` builds it in memory, on the device it will run on, in the
dtype it will run in, and returns it live as a `LoadedCheckpoint` for the engines (a float32 checkpoint on disk
would be ~7 GB, written and read back before the first request; a GPU host may have minutes). The small sizes
go through the same builder (`make_random_checkpoint` is it plus `save_checkpoint`, the same draws).

No pytest and no torch at module top: importing this module is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.errors import UsageError
from workbench.model.checkpoint import CheckpointMeta, LoadedCheckpoint, save_checkpoint
from workbench.sids.layout import Catalog, SidLayout, add_dedup_digit


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
    vocab_size: int | None = None  # embedding rows, padded beyond the layout's tokens as a real model's are
    tie_word_embeddings: bool = False
    rope_theta: float | None = None  # None: transformers' default for the architecture
    max_position_embeddings: int | None = None  # None: what the caller asks for (small_config's default)
    on_disk: bool = True  # False: built in memory only (`random_model`); never a checkpoint folder

    def model_kwargs(self) -> dict:
        """Keyword arguments of `random_model` / `make_random_checkpoint` for this size's model shape."""
        kw = dict(hidden_size=self.hidden_size, num_layers=self.num_layers,
                  num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                  intermediate_size=self.intermediate_size, vocab_base=self.vocab_base)  # fmt: skip
        if self.vocab_size is not None:
            kw["vocab_size"] = self.vocab_size
        if self.tie_word_embeddings:
            kw["tie_word_embeddings"] = True
        if self.rope_theta is not None:
            kw["rope_theta"] = self.rope_theta
        if self.max_position_embeddings is not None:
            kw["max_position_embeddings"] = self.max_position_embeddings
        return kw

    def checkpoint_kwargs(self) -> dict:
        """Keyword arguments of `make_random_checkpoint` for this size (a size built in memory only: an error)."""
        if not self.on_disk:
            raise UsageError(_IN_MEMORY_ONLY)
        return self.model_kwargs()


_IN_MEMORY_ONLY = ("random size 1.7b is built in memory on the device it runs on (random_model; scripts/gpu_probe.sh), "
                   "never written: a float32 checkpoint of it would be ~7 GB; use 25m or smaller for a checkpoint")


SIZES: dict[str, RandomSize] = {
    # 98,752 non-embedding parameters; 0.14M in all with the load benchmark's catalog (348-token vocabulary).
    # head_dim must be >= 32: vLLM-CPU's attention rejects smaller heads at its first forward.
    "0.1m": RandomSize(64, 2, 2, 1, 192, vocab_base=300,
                       purpose="the quickstart's shape (2 heads of 32, 1 KV head): overhead-bound on CPU"),
    # 2,363,264 non-embedding; 2.64M in all with the microbenchmark's catalog (1,080-token vocabulary)
    "2.4m": RandomSize(128, 12, 4, 2, 384, vocab_base=1000, purpose="deep and narrow: the microbenchmark's default"),
    # 25,175,552 non-embedding (8 layers x 3.1M); 27.3M in all with a 2,048-2,080-token vocabulary
    "25m": RandomSize(512, 8, 8, 4, 1536, vocab_base=2000, purpose="prefill-bound on CPU"),
    # 1,720,574,976 in all (1,409,410,048 non-embedding + the tied 151,936 x 2048 embedding): Qwen3-1.7B's shape
    "1.7b": RandomSize(2048, 28, 16, 8, 6144, vocab_base=1000, vocab_size=151_936, tie_word_embeddings=True,
                       rope_theta=1e6, max_position_embeddings=40_960, on_disk=False,
                       purpose="the seeds' Qwen3-1.7B: 16 query / 8 KV heads of 128, built in memory on its device"),
}  # fmt: skip


def random_size(name: str, for_disk: bool = False) -> RandomSize:
    """The size called `name`; an unknown name (or, `for_disk`, one built in memory only) is an error that says
    what to use."""
    if name not in SIZES:
        valid = ", ".join(f"{n} (hidden {s.hidden_size}, {s.num_layers} layers)" for n, s in SIZES.items())
        raise ValueError(f"unknown random model size {name!r}; use one of: {valid}")
    if for_disk and not SIZES[name].on_disk:
        raise UsageError(_IN_MEMORY_ONLY)
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


def _randomize(model, hidden_size: int, peak: float) -> None:
    """The draws every random model gets (module doc), in place; a tied output layer is drawn once, peaked."""
    import torch

    with torch.no_grad():
        # Peaked outputs: logits ~ N(0, peak^2) for a unit-RMS final hidden state.
        w = model.lm_head.weight
        w.copy_(torch.randn_like(w) * (peak / hidden_size**0.5))
        emb = model.get_input_embeddings().weight
        if emb is not w:  # tied: the one matrix keeps the output layer's scale (the first RMSNorm rescales inputs)
            emb.copy_(torch.randn_like(emb))
        # RMSNorm weights drawn around 1, not HF's all-ones: with equal weights everywhere an engine that applies
        # one norm's weight in another's place (q-norm for k-norm, the input norm for the post-attention one)
        # computes the same numbers and every parity test passes anyway.
        for mod in model.modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.uniform_(0.5, 1.5)


def random_model(size: "str | RandomSize | None" = None, *, arch: str = "qwen3", device: str = "cpu",
                 dtype: str = "float32", n_items: int = 200, levels=(8, 8), peak: float = 8.0, soft_token: bool = True,
                 seed: int = 0, **kw) -> LoadedCheckpoint:
    """A random model of `size` (a name of `SIZES`, a RandomSize, or None: the shape in `kw`, as
    `make_random_checkpoint` takes it), built in memory on `device` in `dtype` and returned live with its
    catalog, layout and projector (path None, no tokenizer: engines speak token ids). Nothing is written; on
    device "meta" nothing is allocated either (shapes and parameter counts only)."""
    import torch
    from transformers import AutoModelForCausalLM

    from workbench.model.projector import SoftTokenProjector

    if size is not None:
        kw = {**(random_size(size) if isinstance(size, str) else size).model_kwargs(), **kw}
    hidden_size = int(kw.pop("hidden_size", 64))
    num_layers = int(kw.pop("num_layers", 2))
    vocab_base = int(kw.pop("vocab_base", 300))
    vocab_size = kw.pop("vocab_size", None)
    max_position_embeddings = int(kw.pop("max_position_embeddings", 1024))
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    user_dim = int(kw.pop("user_vector_dim", 16))
    projector_kind = kw.pop("projector_kind", "linear")
    codes, dedup = random_item_codes(n_items, levels, rng)
    layout = SidLayout(base_vocab_size=vocab_base, item_codebooks=tuple(int(k) for k in levels), dedup_size=dedup,
                       user_codebooks=tuple(kw.pop("user_codebooks", (4, 4))))
    if vocab_size is not None and int(vocab_size) < layout.vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the SID layout's {layout.vocab_size} tokens")
    config = small_config(arch, max(layout.vocab_size, int(vocab_size or 0)), hidden_size, num_layers,
                          max_position_embeddings, **kw)
    with torch.device(device):  # the weights are made where they will run, in their dtype: no float32 CPU copy
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).eval()
    _randomize(model, hidden_size, peak)
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    projector = None
    if soft_token:
        projector = SoftTokenProjector(user_dim, hidden_size, projector_kind)
        with torch.no_grad():
            for p in projector.parameters():
                p.normal_(0.0, 1.0 / user_dim**0.5)
        projector = projector.to(device).eval()
    meta = CheckpointMeta(
        method="soft_token" if soft_token else "none",
        layout=layout,
        sid_version=f"random-seed{seed}",
        backbone=f"random-{arch}",
        prompt_template="random tokens; <|user|> placeholder where given",
        user_vector_dim=user_dim if soft_token else None,
        extra={"random_weights": True, "peak": peak},
    )
    return LoadedCheckpoint(path=None, model=model, tokenizer=None, meta=meta, catalog=Catalog(codes, layout),
                            projector=projector)


def make_random_checkpoint(path, arch: str = "qwen3", n_items: int = 200, levels=(8, 8), hidden_size=64,
                           num_layers=2, vocab_base=300, peak: float = 8.0, soft_token: bool = True,
                           seed: int = 0, max_position_embeddings=1024, **kw) -> Path:
    """Write a random small checkpoint to `path` and return it (see module docstring): `random_model` in float32
    on the CPU, saved with a word-level tokenizer."""
    ck = random_model(arch=arch, n_items=n_items, levels=levels, hidden_size=hidden_size, num_layers=num_layers,
                      vocab_base=vocab_base, peak=peak, soft_token=soft_token, seed=seed,
                      max_position_embeddings=max_position_embeddings, **kw)
    return save_checkpoint(path, ck.model, make_word_tokenizer(ck.meta.layout), ck.meta, ck.catalog.item_codes,
                           ck.projector)
