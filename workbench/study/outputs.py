"""The study's public face: the one module of `workbench.study` that the other layers (load/, perf/, report/, the
CLI) import, so the study's insides can move without them noticing (an import-linter contract holds them to it).

Run a study (the CLI's `workbench run`):

    order = resolve_stages(["evaluate"])                   # a stage and every stage it needs, in order
    ctx = run_experiment(cfg, "experiments/quickstart.yaml")

Read what it produced (a load test's `trained:<method>` checkpoints and `prompts_from: test_split`):

    inputs = inputs_from_context(prepare_context(cfg))     # data, embeddings, SIDs: cached, untracked
    ckpt = trained_checkpoint(cfg, inputs, "none")         # what `workbench run` trained; never trains
    prompts = study_test_prompts(cfg, ckpt, inputs)        # its test prompts, as evaluation sends them

Measure quality the way the study does (a faster engine variant against float32, `perf/variant_quality.py`):
`beam_rank` through an engine on `device_options()`, `Quality` of the lists, `compare` of two Qualities; a caller
on its own event loop (the method x engine matrix, `load/matrix.py`) sends `beam_requests` itself and maps the
results with `beam_ranking`; `mean_interval` is the study's interval of a mean. `study_methods(cfg.methods)` names every method a study runs
(context variants included); `context_figure(table, x)` draws quality against prompt length and `history_figure` quality
by history length (the report's copies, with `error_bars`, the study's interval bars).
A checkpoint or prompts the study has not produced raise `StudyError`.

Time the study's own training steps (`perf/trainbench.py`): `training_run(cfg, inputs, method, seed, folder)` is a
started run whose `optimizer_step(batch, mark)` the caller drives; `training_threads(cfg)` is what one training
worker of the study gets, `set_threads(n)` sets torch's and numpy's thread counts.
"""

from __future__ import annotations

from workbench.study.evaluate import Quality, beam_rank, beam_ranking, beam_requests, compare, device_options
from workbench.study.inputs import (StudyError, StudyInputs, inputs_from_context, set_threads, study_test_prompts,
                                    trained_checkpoint)
from workbench.study.intervals import mean_interval
from workbench.study.methods import study_methods
from workbench.study.pipeline import prepare_context, resolve_stages, run_experiment
from workbench.study.stages.train import threads_per_worker as training_threads
from workbench.study.stages.train import training_run
from workbench.study.summary import context_figure, error_bars, history_figure

__all__ = [
    "Quality", "StudyError", "StudyInputs", "beam_rank", "beam_ranking", "beam_requests", "compare", "device_options",
    "context_figure", "error_bars", "history_figure", "inputs_from_context", "mean_interval", "study_methods",
    "prepare_context", "resolve_stages", "run_experiment", "set_threads", "study_test_prompts", "trained_checkpoint",
    "training_run", "training_threads",
]  # fmt: skip
