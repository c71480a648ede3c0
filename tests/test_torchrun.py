"""The study across processes: `workbench run` under torchrun (2 CPU ranks, gloo) against one process.

A tiny study (`workbench.testing.TINY_STUDY_OVERRIDES`, one optimizer step per model: training.max_steps 1)
runs once as

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/torchrun_worker.py run study.yaml

(the CLI plus a record of each step's clipped gradient on every rank) in its own data folder and sqlite
MLflow store. Then, in this process (one rank, one thread like each of the two):

- the same training from the same cached inputs (a copy of the data folder without trained models or
  evaluations): the gradient of the step and the weights after it must equal the 2-rank run's within
  float32 rounding (the bounds are derived below), and the two ranks must have applied the same bits;
- the evaluate stage again, on the 2-rank run's own checkpoints (its evaluation entries moved aside): the
  same model, the users dealt to the ranks in whole engine batches, so every per-user list and every
  number but the latencies must be *equal*;
- the 2-rank run's store: one parent run, every run once and FINISHED, the very runs the one-process run
  logs (rank 1 created none).

Fault injection (run by hand): without the gradient all-reduce (`train._sum_grads` returning at once) the
ranks hold different gradients, and the gradient and weight checks fail by ~2e4x and ~2e6x their bounds; with
each rank's loss weighted 1 / ranks (a mean of means) instead of by its share of the targets, they fail
by ~300x (gradient) and up to ~3e5x (weights).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from workbench.engines.numerics import LAMBDA, UNIT_ROUNDOFF, path_terms

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXP = "torchrun_study"
ADAMW_EPS = 1e-8  # torch.optim.AdamW's default, as train.py builds it


def _store(path: Path) -> str:
    return f"sqlite:///{path / 'mlflow.db'}"


@pytest.fixture(scope="module")
def study(tmp_path_factory, one_torch_thread):
    import torch

    from workbench.config import deep_merge, load_study
    from workbench.study.pipeline import prepare_context, run_experiment
    from workbench.testing import TINY_STUDY_OVERRIDES
    from torchrun_worker import grad_recorder

    work = tmp_path_factory.mktemp("torchrun")
    # batch_targets 255: the first batch is 85 windows of 3 targets, so the ranks' shares differ (43 and 42
    # windows) and a loss not weighted by them would show (with 86 windows both ranks would get 387 targets).
    # 70 validation users = engine batches of 64 + 6, 100 test users = 32 + 32 + 32 + 4: both ranks beam
    # (rank 1 the 2nd and 4th test batch), so the gathered lists must come back in the users' order.
    cfg = deep_merge(TINY_STUDY_OVERRIDES, {
        "base": str(ROOT / "experiments" / "quickstart.yaml"), "name": EXP, "tracking": {"experiment": EXP},
        "training": {"max_steps": 1, "batch_targets": 255, "valid_users": 70},
        "evaluation": {"signal_ablation": False, "test_users": 100},
    })  # fmt: skip
    path = work / "study.yaml"
    path.write_text(json.dumps(cfg))
    two, one = work / "ranks2", work / "ranks1"
    env = {**os.environ, "WORKBENCH_DATA_DIR": str(two / "data"), "MLFLOW_TRACKING_URI": _store(two),
           "WORKBENCH_MLRUNS_DIR": str(two / "mlruns"), "WORKBENCH_GRADS_DIR": str(two / "grads"),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "torchrun_worker.py"), "run", str(path)]
    out = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=420)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]

    # one process trains from the same cached inputs (everything but the trained models and evaluations)
    for kind in (two / "data" / "cache").iterdir():
        if kind.name not in ("train", "eval"):
            shutil.copytree(kind, one / "data" / "cache" / kind.name)
    study = load_study(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORKBENCH_DATA_DIR", str(one / "data"))
        mp.setattr(torch.nn.utils, "clip_grad_norm_", grad_recorder(one / "grads.pt"))
        trained = prepare_context(study, stages=("train",)).products["train"]

    # ... and evaluates the 2-rank run's checkpoints again, logging to its own store
    shutil.move(two / "data" / "cache" / "eval", two / "eval_by_2_ranks")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORKBENCH_DATA_DIR", str(two / "data"))
        mp.setenv("MLFLOW_TRACKING_URI", _store(one))
        mp.setenv("WORKBENCH_MLRUNS_DIR", str(one / "mlruns"))
        run_experiment(study, path, stages=["evaluate"])
    return SimpleNamespace(two=two, one=one, trained=trained, cfg=study)


def _optimizer_params(checkpoint: Path) -> list:
    """A checkpoint's trainable tensors in the optimizer's order (the order of the recorded gradients)."""
    from workbench.model.backbone import apply_trainable
    from workbench.model.checkpoint import load_checkpoint

    ck = load_checkpoint(checkpoint)
    return [p.detach() for g in apply_trainable(ck.model, "all", ck.meta.layout, ck.projector) for p in g["params"]]


def _grad_bound(g, n: int) -> float:
    """How far two correct float32 computations of one step's gradient tensor `g` may differ.

    Every gradient entry is a sum over the batch: one term per token position (its path through the model
    adds the products of workbench/engines/numerics.py's `path_terms`), n terms in all. One process sums the whole
    batch at once; two ranks each sum their half of the windows, weighted by their share of the targets
    (weights n_r / n, the one-process mean's 1 / n split in two), and the all-reduce adds the two halves:
    the same terms, grouped and ordered otherwise, each through kernels blocked for another batch shape.
    As in numerics.py (first-order probabilistic rounding analysis, Higham & Mary 2019, Thm 3.1), one
    computation is within lam * sqrt(n) * u * Z of the exact sum, Z the scale of the sums (the tensor's
    largest entry); two differ by at most twice that:

        bound = 2 * lam * sqrt(n) * u * max|g|          (u = 2^-24, lam = 5)

    Here n ~ 3,000 (~1,100-1,200 tokens in the batch + ~1,800 along the path at the longest context), so
    the bound is ~540 u * max|g|; observed: 1 to 6 u * max|g|. Faults land far outside: without the
    all-reduce a rank steps on its own half (~1e7 u * max|g|, most of max|g|); with each rank's mean
    weighted 1 / ranks instead of by its share of the targets (43 vs 42 windows here), ~1e5 u * max|g|."""
    return 2 * LAMBDA * math.sqrt(n) * UNIT_ROUNDOFF["float32"] * float(g.abs().max())


def test_one_step_on_two_ranks_equals_one_process(study):
    """The gradient AdamW applies and the weights after the step, 2 ranks vs 1 process, per model."""
    import torch

    from workbench.cache import read_done
    from workbench.study.train import TrainResult

    on_ranks = [torch.load(study.two / "grads" / f"rank{r}.pt") for r in (0, 1)]
    alone = torch.load(study.one / "grads.pt")
    assert len(alone) == len(on_ranks[0]) == len(on_ranks[1]) == len(study.trained) == 2  # one step per model
    for a, b in zip(*on_ranks):  # the all-reduce hands every rank the same bits: the ranks stay identical
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    u = UNIT_ROUNDOFF["float32"]
    for res1, g1s, g2s in zip(study.trained.values(), alone, on_ranks[0]):
        ck2 = study.two / "data" / res1.checkpoint.relative_to(study.one / "data")
        res2 = TrainResult.from_entry(ck2.parent, read_done(ck2.parent))
        assert res2.steps == res1.steps == 1
        # counts are summed over the ranks: the same tokens, targets and FLOPs as one process
        counts = ((r.train_tokens, r.train_targets, r.flops) for r in (res1, res2))
        assert next(counts) == next(counts)
        w1s, w2s = _optimizer_params(res1.checkpoint), _optimizer_params(ck2)
        assert [w.shape for w in w1s] == [g.shape for g in g1s] == [g.shape for g in g2s]
        config = _config(res1.checkpoint)
        n = res1.train_tokens + path_terms(config, config.max_position_embeddings)  # terms per gradient entry
        for w1, w2, g1, g2 in zip(w1s, w2s, g1s, g2s):
            g1, g2, w1, w2 = g1.double(), g2.double(), w1.double(), w2.double()
            assert float((g2 - g1).abs().max()) <= _grad_bound(g1, n), (res1.method, tuple(g1.shape))
            # AdamW's first step: w <- w * (1 - lr * wd) - lr * f(g), f(g) = g / (|g| + eps) (m / (sqrt(v) + eps)
            # with m = g, v = g^2 once bias-corrected). Both runs decay the same starting weight by the same op
            # (the same bits), so the weights differ by lr * |f(g2) - f(g1)| <= lr * delta * max f' over
            # |g - g1| <= delta (mean value theorem; f'(g) = eps / (|g| + eps)^2, largest where |g| is least),
            # delta the gradient bound above, and never by more than lr * 2 (|f| < 1); plus float32 rounding:
            # the update (lerp, mul + addcmul, sqrt, div, add eps, div, mul: <= 7 roundings of a value <= lr)
            # in each run, and the final add (round to nearest: off by <= u * |result|) in each run.
            delta = _grad_bound(g1, n)
            slope = ADAMW_EPS / ((g1.abs() - delta).clamp(min=0) + ADAMW_EPS) ** 2
            bound = res1.lr * (delta * slope).clamp(max=2) + u * (2 * 7 * res1.lr + w1.abs() + w2.abs())
            assert bool(((w2 - w1).abs() <= bound).all()), (res1.method, tuple(w1.shape))


def _config(checkpoint: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(checkpoint)


def test_evaluation_sharded_over_two_ranks_equals_one_process(study):
    """The same checkpoints evaluated on 2 ranks and in 1 process: per-user lists and metrics equal."""
    from workbench.cache import read_done

    two, one = study.two / "eval_by_2_ranks", study.two / "data" / "cache" / "eval"
    keys = sorted(p.name for p in two.iterdir())
    assert keys == sorted(p.name for p in one.iterdir()) and len(keys) == len(study.trained)
    for key in keys:
        m2, m1 = read_done(two / key), read_done(one / key)
        timed = [k for k in m1 if k.startswith("latency/")]
        assert timed and all(not math.isnan(m2[k]) for k in timed)  # measured on rank 0
        assert {k: v for k, v in m2.items() if k not in timed} == {k: v for k, v in m1.items() if k not in timed}
        z2, z1 = np.load(two / key / "per_user.npz"), np.load(one / key / "per_user.npz")
        assert z2.files == z1.files and all(np.array_equal(z2[f], z1[f]) for f in z1.files), key
    logged = {s: {r.info.run_name: r.data.metrics for r in _runs(_store(s))} for s in (study.two, study.one)}
    evals = [name for name in logged[study.one] if name.endswith("/seed0") and not name.startswith("baseline/")]
    assert len(evals) == len(study.trained)
    for name in evals:
        drop = ("latency/", "time/")
        a, b = ({k: v for k, v in logged[s][name].items() if not k.startswith(drop)} for s in (study.two, study.one))
        assert a == b, name


def _runs(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(EXP).experiment_id], max_results=1000)


def test_only_rank_0_logged(study):
    """One parent, every run once: the runs of the one-process run, no duplicate from rank 1."""
    from workbench import names

    two, one = _runs(_store(study.two)), _runs(_store(study.one))
    (parent,) = [r for r in two if "mlflow.parentRunId" not in r.data.tags]
    counts = Counter(r.info.run_name for r in two)
    assert max(counts.values()) == 1, counts
    assert sorted(counts) == sorted(r.info.run_name for r in one)
    assert {"data", "train", "evaluate", "train/none/seed0/lr0.003", "soft_token/seed0"} <= set(counts)
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in two if r is not parent)
    assert {r.info.status for r in two} == {"FINISHED"}
    assert parent.data.tags[names.TAG_STAGES] == "data,embeddings,semantic_ids,train,evaluate"
