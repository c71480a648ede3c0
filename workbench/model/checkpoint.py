"""Checkpoint format: a Hugging Face model directory plus what the workbench needs to serve it.

    <dir>/config.json, model.safetensors, tokenizer files   (plain HF: any HF tool can load it)
    <dir>/projector.safetensors                            (soft-token projector, when there is one)
    <dir>/catalog.npz                                      (item_codes [n_items, item_depth], dedup digit included)
    <dir>/workbench.json                                   (CheckpointMeta: method, SID layout, SID version, ...)

Engines load only this directory (training writes it, `load_checkpoint` reads it), so a checkpoint
is self-describing: the token layout says which ids are SID tokens and which is the `<|user|>`
placeholder, the catalog gives the prefix trie of valid SIDs, and `sid_version` ties the codes to
the semantic-id config that produced them.

Weights load from safetensors only (`model.safetensors`, or its sharded index): pickle-based formats
(`pytorch_model.bin`, `.pt`, `.pth`) can run arbitrary code when loaded, so a checkpoint holding
only those is refused with the one-line conversion, never loaded (`require_safetensors`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench import names
from workbench.errors import UsageError
from workbench.sids.layout import Catalog, SidLayout

META_FILE = "workbench.json"
CATALOG_FILE = "catalog.npz"
PROJECTOR_FILE = "projector.safetensors"
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")  # what from_pretrained loads, one or sharded
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")  # torch.load/pickle formats: loading can run code
FORMAT_VERSION = 1

_DTYPES = ("float32", "bfloat16", "float16", "float64")


class CheckpointError(UsageError, ValueError):
    """A checkpoint directory that is missing files or is inconsistent; the message says what."""


@dataclass
class CheckpointMeta:
    method: str  # a registered method's name (study/methods/): none | none_long | text_history | user_sid | ...
    layout: SidLayout  # token ids of SIDs and special tokens
    sid_version: str  # hash of the semantic-id config/cache that produced the codes
    backbone: str  # tiny-qwen3 | smollm2-135m | hf:<path>
    prompt_template: str = ""  # human-readable description of the prompt layout
    placeholder_token: str = "<|user|>"
    user_vector_dim: int | None = None  # None when there is no projector
    format_version: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layout"] = self.layout.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CheckpointMeta":
        version = int(d.get("format_version", 1))
        if version > FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint format_version {version} is newer than this workbench understands ({FORMAT_VERSION}); "
                "upgrade the workbench"
            )
        return cls(
            method=str(d["method"]),
            layout=SidLayout.from_dict(d["layout"]),
            sid_version=str(d.get("sid_version", "")),
            backbone=str(d.get("backbone", "")),
            prompt_template=str(d.get("prompt_template", "")),
            placeholder_token=str(d.get("placeholder_token", "<|user|>")),
            user_vector_dim=None if d.get("user_vector_dim") is None else int(d["user_vector_dim"]),
            format_version=version,
            extra=dict(d.get("extra", {})),
        )


@dataclass
class LoadedCheckpoint:
    path: Path | None  # None: built in memory (random_checkpoint.random_model), never on disk
    model: Any  # transformers PreTrainedModel (eval mode)
    tokenizer: Any  # transformers tokenizer
    meta: CheckpointMeta
    catalog: Catalog
    projector: Any  # SoftTokenProjector | None

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


def save_checkpoint(path, model, tokenizer, meta: CheckpointMeta, item_codes: np.ndarray, projector=None) -> Path:
    """Write the HF directory, the projector, the catalog and `workbench.json`; returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # the registry (above this layer) knows which names exist; this is their shape: an identifier, or a context
    # variant of one (none-k5, names.context_variant)
    if not names.split_context_variant(meta.method)[0].isidentifier():
        raise CheckpointError(f"method {meta.method!r} is not a method name (a Python identifier, e.g. soft_token, "
                              f"or a context variant of one, e.g. {names.context_variant('none', 5)})")
    vocab = int(model.config.vocab_size)
    if vocab < meta.layout.vocab_size:
        raise CheckpointError(
            f"model vocab_size {vocab} is smaller than the SID layout's {meta.layout.vocab_size}; "
            "resize the token embeddings after extending the tokenizer"
        )
    Catalog(item_codes, meta.layout)  # validates shape, ranges and uniqueness
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    d = meta.to_dict()
    if projector is not None:
        from safetensors.torch import save_file

        if meta.user_vector_dim is not None and meta.user_vector_dim != projector.in_dim:
            raise CheckpointError(f"meta.user_vector_dim {meta.user_vector_dim} != projector.in_dim {projector.in_dim}")
        d["user_vector_dim"] = projector.in_dim
        d["projector"] = projector.config()
        state = {k: v.detach().contiguous().cpu() for k, v in projector.state_dict().items()}
        save_file(state, str(path / PROJECTOR_FILE))
    else:
        d["user_vector_dim"] = None
        (path / PROJECTOR_FILE).unlink(missing_ok=True)
    np.savez(path / CATALOG_FILE, item_codes=np.asarray(item_codes, dtype=np.int64))
    (path / META_FILE).write_text(json.dumps(d, indent=2, sort_keys=True))
    return path


def read_meta(path) -> CheckpointMeta:
    """Read only `workbench.json` (cheap; no torch)."""
    _require_dir(path)
    f = Path(path) / META_FILE
    if not f.exists():
        raise CheckpointError(f"{path} is not a workbench checkpoint: {META_FILE} is missing; give the folder training "
                              "writes (data/cache/train/<key>/checkpoint) or one written with save_checkpoint")
    try:
        return CheckpointMeta.from_dict(json.loads(f.read_text()))
    except (ValueError, TypeError, KeyError) as e:  # hand-edited or truncated: say which file, not a traceback
        raise CheckpointError(f"{f} is not a valid checkpoint description ({type(e).__name__}: {e}); "
                              "rewrite it with save_checkpoint or restore it from the training cache") from e


def read_catalog(path) -> Catalog:
    """The checkpoint's item catalog (its `catalog.npz` and layout; no model weights loaded)."""
    return Catalog(np.load(Path(path) / CATALOG_FILE)["item_codes"], read_meta(path).layout)


def _require_dir(path) -> None:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a file; give its folder (with {META_FILE} and model.safetensors)")


def require_safetensors(path) -> None:
    """Refuse a checkpoint whose model weights are not safetensors (cheap: looks at file names only).

    Hugging Face's loader falls back to `pytorch_model.bin` when `model.safetensors` is missing, and
    unpickling runs whatever code the file carries; the workbench never does. The message names the
    pickle files found and the one-time conversion (to run only on a file whose source one trusts).
    """
    path = Path(path)
    if any((path / name).is_file() for name in SAFE_WEIGHTS):
        return
    pickles = sorted(f.name for f in path.iterdir() if f.suffix in PICKLE_SUFFIXES) if path.is_dir() else []
    if not pickles:
        raise CheckpointError(f"checkpoint {path} has no model weights: model.safetensors is missing; "
                              "copy the whole folder training wrote")
    convert = (f"python -c \"from transformers import AutoModelForCausalLM as M; "
               f"M.from_pretrained('{path}', use_safetensors=False).save_pretrained('{path}')\"")
    raise CheckpointError(
        f"checkpoint {path} has only pickle weights ({', '.join(pickles)}); the workbench loads safetensors only, "
        f"as loading a pickle can run code.\n  if you trust its source, convert it once: {convert}"
    )


def _torch_dtype(dtype: str):
    import torch

    if dtype not in _DTYPES:
        raise CheckpointError(f"unknown dtype {dtype!r}; use one of {_DTYPES}")
    return getattr(torch, dtype)


def load_projector(path, device: str = "cpu"):
    """The checkpoint's projector in float32 (it is tiny; engines cast its output), or None."""
    path = Path(path)
    raw = json.loads((path / META_FILE).read_text())
    if "projector" not in raw or not (path / PROJECTOR_FILE).exists():
        return None
    from safetensors.torch import load_file

    from workbench.model.projector import SoftTokenProjector

    proj = SoftTokenProjector.from_config(raw["projector"])
    proj.load_state_dict(load_file(str(path / PROJECTOR_FILE)))
    return proj.to(device).eval()


def load_checkpoint(path, dtype: str = "float32", device: str = "cpu") -> LoadedCheckpoint:
    """Load model (eval mode, `dtype`, `device`), tokenizer, meta, catalog and projector."""
    path = Path(path)
    meta = read_meta(path)
    require_safetensors(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # use_safetensors: never the .bin fallback, even if a file appears between the check and the load
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_torch_dtype(dtype), use_safetensors=True)
    model = model.to(device).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tokenizer = None  # engines speak token ids; a missing tokenizer only matters for text prompts
    if tokenizer is not None:
        from workbench.model.backbone import mark_special_tokens

        mark_special_tokens(tokenizer, meta.layout)  # checkpoints written before the structural tokens were special
    cat_file = path / CATALOG_FILE
    if not cat_file.exists():
        raise CheckpointError(f"{cat_file} is missing; the checkpoint has no item catalog")
    catalog = Catalog(np.load(cat_file)["item_codes"], meta.layout)
    projector = load_projector(path, device=device)
    if meta.user_vector_dim is not None and projector is None:
        raise CheckpointError(f"{path}: workbench.json declares a user vector but {PROJECTOR_FILE} is missing")
    return LoadedCheckpoint(path=path, model=model, tokenizer=tokenizer, meta=meta, catalog=catalog, projector=projector)
