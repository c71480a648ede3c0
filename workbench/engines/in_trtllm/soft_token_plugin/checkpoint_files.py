"""Where the soft-token plugin finds the workbench files of the checkpoint it is serving.

TensorRT-LLM is given `launcher.serving_dir(checkpoint)`, a view of the checkpoint that leaves out
`projector.safetensors`, `catalog.npz` and `workbench.json` (engines load every `*.safetensors` in a
model directory, and the projector's `net.*` tensors are no model weights). The model's
`pretrained_config._name_or_path` is that view, so the plugin cannot look for the projector next to
it. Every other file of the view is a symlink to the checkpoint, so the checkpoint directory is the
one `config.json` resolves into; a copied model directory falls back to itself and then to
`WORKBENCH_TRTLLM_CHECKPOINT`, which the launcher sets for trtllm-serve and for the scoring layer.

Standard library only (no `tensorrt_llm` import), so the CPU test suite can load this file directly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CHECKPOINT_ENV = "WORKBENCH_TRTLLM_CHECKPOINT"
META_FILE = "workbench.json"
PROJECTOR_FILE = "projector.safetensors"


def checkpoint_dir(model_dir: str | os.PathLike | None) -> Path:
    """The workbench checkpoint directory behind `model_dir` (a serving view or the checkpoint itself)."""
    tried: list[Path] = []
    if model_dir:
        d = Path(model_dir)
        # the view's config.json is a symlink into the checkpoint: its target's folder is the checkpoint
        tried += [(d / "config.json").resolve().parent, d.resolve()]
    if os.environ.get(CHECKPOINT_ENV):
        tried.append(Path(os.environ[CHECKPOINT_ENV]).resolve())
    for cand in tried:
        if (cand / META_FILE).is_file():
            return cand
    raise FileNotFoundError(f"no {META_FILE} found for model directory {model_dir!r} (looked in "
                            f"{[str(p) for p in tried]}); serve a workbench checkpoint, or set {CHECKPOINT_ENV}")


def workbench_meta(model_dir: str | os.PathLike | None) -> dict:
    """The checkpoint's workbench.json as a dict."""
    return json.loads((checkpoint_dir(model_dir) / META_FILE).read_text())


def projector_file(model_dir: str | os.PathLike | None) -> Path:
    """The checkpoint's `projector.safetensors`; a clear error when the checkpoint has none."""
    f = checkpoint_dir(model_dir) / PROJECTOR_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{f} is missing: workbench.json declares a soft-token projector but the checkpoint "
                                "directory has no projector file")
    return f
