"""What the pipeline's stages share: the `StageContext` they fill in order, the child runs they log to under
the parent run, and the SID layout rule.

Separate from pipeline.py so that the stages (`stages/`) can read the context without importing the runner
that calls them (no import circle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from workbench import names
from workbench.config import StudyConfig


class NullRun:
    """Stands in for an MLflow run when stages run untracked (`prepare_context`)."""

    run_id = None

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("log_") or name == "set_tags":
            return lambda *a, **k: None
        raise AttributeError(name)


@dataclass
class StageContext:
    """Everything a stage needs: the config, the live runs and the products of earlier stages."""

    cfg: StudyConfig
    experiment_file: str | None = None
    stages: tuple[str, ...] = ()  # the stages this run executes, in order (a stage may prepare for a later one)
    parent: Any = None  # parent run handle (tracking._RunHandle) or None when untracked
    run: Any = None  # the current stage's child run handle (or a no-op stand-in)
    # data
    dataset: Any = None  # workbench.data.tables.Dataset
    split: Any = None  # workbench.data.splits.Split
    # embeddings
    text_vectors: np.ndarray | None = None  # [n_items, 384] or None when not needed
    als: Any = None  # workbench.sids.embeddings.AlsModel (user_factors = train-history user vectors)
    als_folds: Any = None  # sids.embeddings.AlsFolds: per-user fold models that never saw that user
    # semantic ids
    item_vectors: np.ndarray | None = None  # what the item quantizer encoded
    item_sids: dict[str, Any] = field(default_factory=dict)  # kind -> quantize.ItemSids (every fitted kind)
    item_codes: np.ndarray | None = None  # [n_items, levels + 1] of `semantic_ids.kind`, dedup digit last
    item_codebooks: tuple[int, ...] = ()
    dedup_size: int = 0
    user_quantizer: Any = None  # quantize.RQKMeans | RQVAE over ALS user vectors
    user_codes: np.ndarray | None = None  # [n_users, user levels] from the full train history
    catalog: Any = None  # semantic_ids.Catalog with base_vocab_size 0 (use catalog_for(base) for a model)
    # the user signal (study/user_signal.py): a prompts.UserEncoder over `user_signal.source`, or None
    user_signal: Any = None
    # bookkeeping
    keys: dict[str, str] = field(default_factory=dict)  # stage -> cache key
    cache_hits: dict[str, bool] = field(default_factory=dict)
    stats: dict[str, dict] = field(default_factory=dict)  # stage -> logged metrics
    timings: dict[str, float] = field(default_factory=dict)  # stage -> wall seconds
    products: dict[str, Any] = field(default_factory=dict)  # later stages put their results here

    @property
    def sid_version(self) -> str:
        """Hash of the semantic-id config + upstream data that produced the codes (for checkpoints)."""
        return self.keys["semantic_ids"]

    @property
    def user_codebooks(self) -> tuple[int, ...]:
        return tuple(self.user_quantizer.codebook_sizes) if self.user_quantizer is not None else ()

    def layout(self, base_vocab_size: int):
        """The SidLayout of these SIDs for a tokenizer with `base_vocab_size` tokens."""
        return sid_layout(self.item_codebooks, self.dedup_size, self.user_codebooks, base_vocab_size)

    def catalog_for(self, base_vocab_size: int):
        from workbench.sids.layout import Catalog

        return Catalog(self.item_codes, self.layout(base_vocab_size))

    def user_vectors_as_of(self, item_lists) -> np.ndarray:
        """ALS user vectors folded in from each item list (item factors fixed): [n, factors]."""
        from workbench.sids.embeddings import fold_in_users

        return fold_in_users(self.als, item_lists)

    def user_codes_as_of(self, item_lists) -> np.ndarray:
        """User SID codes [n, user levels] as of each item list (fold-in, then the user quantizer)."""
        return self.user_quantizer.encode(self.user_vectors_as_of(item_lists))


class _SafeRun:
    """Wraps a run handle so metric names are MLflow-safe (`names.metric_name`)."""

    def __init__(self, run):
        self._run = run

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self._run.log_metrics({names.metric_name(k): v for k, v in metrics.items()}, step)

    def __getattr__(self, name):
        return getattr(self._run, name)


def child_run(ctx, name: str, tags: dict):
    import contextlib

    from workbench import tracking

    if ctx.parent is None:
        return contextlib.nullcontext(NullRun())

    @contextlib.contextmanager
    def wrapped():
        with tracking.start_run(name, parent=ctx.parent, tags=tags) as run:
            yield _SafeRun(run)

    return wrapped()


def sid_layout(item_codebooks, dedup_size: int, user_codebooks, base_vocab_size: int):
    """SidLayout from fitted quantizer sizes; the one place the pipeline's SIDs become token blocks."""
    from workbench.sids.layout import SidLayout

    return SidLayout(
        base_vocab_size=int(base_vocab_size),
        item_codebooks=tuple(int(x) for x in item_codebooks),
        dedup_size=int(dedup_size),
        user_codebooks=tuple(int(x) for x in user_codebooks),
    )


def say(msg: str) -> None:
    """A stage's line of progress on the console, flushed (training workers share it)."""
    print(msg, flush=True)
