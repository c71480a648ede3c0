"""`workbench run`: an experiment's stages, each cached by the config that produced it, all in MLflow.

    ctx = run_experiment(load_study("experiments/quickstart.yaml"), "experiments/quickstart.yaml")

The runner alone: which stages a run needs (`resolve_stages`), then each in order, `STAGES[name](ctx)` on one
`StageContext`, with a parent MLflow run and one child run per stage (`run_experiment`) or untracked
(`prepare_context`). What each stage does lives in its own module under `stages/` (the order and what a stage is:
`stages/__init__.py`); `STAGES` below is the registry of stage name -> function.

Caching (`workbench.cache.cached`): each stage's products live in `data/cache/<stage>/<key>/`,
where the key is `config.section_hash` of the config sections the stage reads plus the keys of the
stages it depends on, so re-running is instant and changing any knob a stage depends on recomputes
it (and everything downstream).

Tracking: one parent MLflow run per run of an experiment file (experiment name:
`tracking.experiment` or the config's `name`; store: `tracking.uri` or the environment's), one
child run per stage with its stats, timings and figures. A stage that raises ends its child and
the parent FAILED; earlier children stay FINISHED with everything they logged. Asking for a later
stage runs the stages it needs first (they are cache hits when nothing changed).

Under torchrun (`workbench.dist`) every rank runs the same stages in the same order; rank 0 alone
creates the runs and writes the caches, the other ranks run untracked beside it (training and
evaluation are shared, everything else they read from rank 0's cache entries).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from workbench import names
from workbench.config import ConfigError, StudyConfig
from workbench.study.context import NullRun, StageContext, say
from workbench.study.inputs import inputs_from_context
from workbench.study.stages import DEPENDS, ORDER
from workbench.study.stages.data import stage_data
from workbench.study.stages.embeddings import stage_embeddings
from workbench.study.stages.evaluate import evaluate_stage
from workbench.study.stages.semantic_ids import stage_semantic_ids
from workbench.study.stages.train import train_stage


def stage_train(ctx: StageContext) -> Any:
    """The train stage, told how a training worker (`training.workers`) rebuilds its inputs: `study_inputs`."""
    return train_stage(ctx, build_inputs=study_inputs)


def study_inputs(cfg: StudyConfig):
    """The train stage's StudyInputs from the cached data stages, quietly: what a training worker (another process,
    `training.workers`) starts from; the main process ran and reported those stages already."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        ctx = prepare_context(cfg)
    return inputs_from_context(ctx)


STAGES: dict[str, Callable[[StageContext], Any]] = {
    "data": stage_data,
    "embeddings": stage_embeddings,
    "semantic_ids": stage_semantic_ids,
    "train": stage_train,
    "evaluate": evaluate_stage,
}


def resolve_stages(requested) -> list[str]:
    """Requested stages plus everything they depend on, in pipeline order."""
    requested = list(requested)
    unknown = [s for s in requested if s not in STAGES]
    if unknown:
        raise ConfigError(f"unknown stage(s) {', '.join(map(str, unknown))}; valid stages: {', '.join(ORDER)}")
    need: set[str] = set()

    def add(s: str) -> None:
        if s not in need:
            need.add(s)
            for d in DEPENDS[s]:
                add(d)

    for s in requested:
        add(s)
    return [s for s in ORDER if s in need]


def _run_stage(ctx: StageContext, name: str, index: int, total: int) -> None:
    say(f"[{index}/{total}] {name}")
    t0 = time.perf_counter()
    out = STAGES[name](ctx)
    if out is not None:
        ctx.products[name] = out
    ctx.timings[name] = time.perf_counter() - t0
    ctx.run.log_metrics({f"time/stage_{name}_s": ctx.timings[name]})
    if name in ctx.keys:
        hit = ctx.cache_hits.get(name, False)
        ctx.run.set_tags({names.TAG_CONFIG_HASH: ctx.keys[name], names.TAG_CACHE_HIT: hit})
    say(f"  {name} done in {ctx.timings[name]:.1f}s" + (" (cached)" if ctx.cache_hits.get(name) else ""))


def run_experiment(cfg: StudyConfig, experiment_file: str | Path | None = None, stages=None) -> StageContext:
    """Run `stages` (default: the config's) with a parent MLflow run and one child run per stage.

    Runs go to the config's `tracking.uri` when it has one (a team server), else to the store the
    environment selects: entered here, once, so the CLI and the notebooks get it alike. Under torchrun
    only rank 0 logs; the other ranks run the same stages untracked, in step with it.
    """
    from workbench import dist, tracking

    if not dist.is_main():
        ctx = prepare_context(cfg, stages if stages else cfg.stages)
        ctx.experiment_file = str(experiment_file) if experiment_file else None
        return ctx
    with tracking.use(cfg.tracking.uri):
        return _run_tracked(cfg, experiment_file, stages)


def _run_tracked(cfg: StudyConfig, experiment_file: str | Path | None, stages) -> StageContext:
    from workbench import tracking

    order = resolve_stages(stages if stages else cfg.stages)
    ctx = StageContext(cfg=cfg, experiment_file=str(experiment_file) if experiment_file else None,
                       stages=tuple(order))
    experiment = cfg.experiment_name
    with tracking.start_run(
        cfg.name,
        experiment=experiment,
        config=cfg,
        experiment_file=ctx.experiment_file,
        tags={names.TAG_DATASET: cfg.dataset.name, names.TAG_STAGES: ",".join(order)},
    ) as parent:
        ctx.parent = parent
        try:
            for i, name in enumerate(order, 1):
                with tracking.start_run(name, parent=parent, tags={names.TAG_STAGE: name}) as run:
                    ctx.run = run
                    _run_stage(ctx, name, i, len(order))
                parent.log_metrics({f"time/stage_{name}_s": ctx.timings[name]})
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):  # Ctrl-C, or SIGTERM/SIGHUP (signals.Terminated): MLflow says KILLED
                status = f"KILLED ({str(e) or 'SIGINT'})"
            else:  # the first line: the exception itself follows with its traceback
                first = str(e).splitlines()[0] if str(e) else ""
                status = f"FAILED ({type(e).__name__}{': ' + first if first else ''})"
            say(f"run {status}; what finished is kept.\n{tracking.ui_hint(parent.run_id)}")
            raise
        finally:
            ctx.run = None
        parent.log_dict({"keys": ctx.keys, "cache_hits": ctx.cache_hits, "timings": ctx.timings}, "stages.json")
    say(f"parent run id: {parent.run_id}\n{tracking.ui_hint(parent.run_id)}")
    return ctx


def prepare_context(cfg: StudyConfig, stages=("data", "embeddings", "semantic_ids")) -> StageContext:
    """Run (or load from cache) stages without MLflow: for notebooks, tests and other stages' helpers."""
    order = resolve_stages(stages)
    ctx = StageContext(cfg=cfg, stages=tuple(order))
    ctx.run = NullRun()
    for i, name in enumerate(order, 1):
        _run_stage(ctx, name, i, len(order))
    return ctx
