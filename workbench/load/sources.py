"""Where a load sweep's checkpoints and prompts come from: a path, a random checkpoint of a named
size (built once, cached), or `trained:<method>` from the study file named by `load.study`, whose
test prompts a `prompts_from: test_split` sweep replays (`StudySource`, prepared once per sweep).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, LoadConfig, section_hash
from workbench.errors import UsageError
from workbench.model.random_checkpoint import SIZES, WEIGHTS_VERSION, make_random_checkpoint, random_size


class StudySource:
    """The study (`load.study`) behind trained checkpoints and test-split prompts, prepared once per sweep."""

    def __init__(self, path: str, seed: int | None = None):
        from workbench.config import load_study

        self.path = path
        self.seed = seed  # trained:<method>'s seed (None: the first of the study's training.seeds)
        self.cfg = load_study(path)
        self._inputs = None
        self._prompts: dict[Path, Any] = {}  # per checkpoint: every engine of the sweep replays the same set

    @property
    def inputs(self):
        if self._inputs is None:
            from workbench.study.outputs import inputs_from_context, prepare_context

            print(f"[bench] preparing the study {self.path} (data, embeddings, SIDs; cached)", file=sys.stderr)
            self._inputs = inputs_from_context(prepare_context(self.cfg))
        return self._inputs

    def checkpoint(self, method: str) -> Path:
        from workbench.study.outputs import trained_checkpoint

        return trained_checkpoint(self.cfg, self.inputs, method, self.seed).resolve()

    def test_prompts(self, checkpoint: Path):
        from workbench.study.outputs import study_test_prompts

        if checkpoint not in self._prompts:
            self._prompts[checkpoint] = study_test_prompts(self.cfg, checkpoint, self.inputs)
        return self._prompts[checkpoint]


def resolve_checkpoint(spec: str, load: LoadConfig, study: StudySource | None = None) -> Path:
    """A checkpoint directory for `spec`: a path, `trained:<method>` (from `load.study`'s train cache), or
    `random:<size>` built once and cached under data/."""
    if spec.startswith("trained:"):  # LoadConfig guarantees load.study is set
        return study.checkpoint(spec.split(":", 1)[1])
    if not spec.startswith("random:"):
        p = Path(spec).expanduser()
        if not (p / "workbench.json").exists():
            raise ConfigError(
                f"load.checkpoints: {spec} is not a workbench checkpoint (no workbench.json); train one with "
                f"`workbench run` or use random:<size>, one of {[n for n, s in SIZES.items() if s.on_disk]} "
                "(workbench/model/random_checkpoint.py)"
            )
        return p.resolve()
    try:
        size = random_size(spec.split(":", 1)[1], for_disk=True)
    except (ValueError, UsageError) as e:
        raise ConfigError(f"load.checkpoints: {e}") from None
    need = load.prompt_tokens + max(load.max_new_tokens, load.candidate_tokens) + 8
    max_pos = max(1024, 1 << (need - 1).bit_length())
    n_items = max(200, load.candidates)
    kw = dict(size.checkpoint_kwargs(), max_position_embeddings=max_pos, n_items=n_items, soft_token=False, seed=0)
    from workbench.cache import cached

    def load_ck(folder: Path, info: dict) -> Path:
        if not (folder / "checkpoint" / "workbench.json").exists():
            raise KeyError("checkpoint files missing")
        return (folder / "checkpoint").resolve()

    def build(folder: Path):
        print(f"[bench] building a {spec} checkpoint in {folder}", file=sys.stderr)
        return make_random_checkpoint(folder / "checkpoint", **kw).resolve(), {"spec": spec}

    return cached("bench_checkpoints", section_hash(spec, kw, WEIGHTS_VERSION), build, load_ck,
                  say=lambda m: print(f"[bench]{m}", file=sys.stderr))[0]


# ---- results ------------------------------------------------------------------------------------------
