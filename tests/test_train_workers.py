"""`training.workers`: models trained side by side in worker processes (workbench/study/workers.py).

- The same tiny study trained in this process (workers 1) and in 2 worker processes (workers 2), one thread per
  process either way, each in its own data folder: every model's weights are *equal*, tensor by tensor (each
  model trains the same way in its worker), and the MLflow child runs carry the same metric series (the
  worker's live metrics replayed), FINISHED, marked as trained in this run; a second run loads every model.
- SIGTERM to `workbench run` while its workers train: exit 143, no worker left, no MLflow run RUNNING; the next
  run resumes and finishes.
- A worker killed (SIGKILL, as the kernel's OOM killer does): the study fails with a message that says which
  model's worker died and that a new run resumes; the model's run and the study's are FAILED; no process left.
- The main process killed (SIGKILL: nothing of it can clean up): its workers notice and exit on their own.

Fault injection (by hand): the worker training seed + 1 (`stages.train._worker_train`) -> the main process finds no
entry for the model and fails; the replay of the worker's metrics left out -> the metric series differ (empty);
`workers._stop` not terminating the workers -> they train on after SIGTERM and finish their models (done.json); no
parent watchdog in the workers -> they outlive a killed main process.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from cli_procs import RUNNING, Proc, cli_env, gone, store_runs

pytestmark = pytest.mark.timeout(420)

ROOT = Path(__file__).resolve().parent.parent
STAGES = ["data", "embeddings", "semantic_ids", "train"]


def _study(name: str, **training) -> dict:
    from workbench.config import deep_merge
    from workbench.testing import TINY_STUDY_OVERRIDES

    return deep_merge(TINY_STUDY_OVERRIDES, {
        "base": str(ROOT / "experiments" / "quickstart.yaml"), "name": name, "tracking": {"experiment": name},
        "training": {"max_steps": 45, **training}, "stages": STAGES,
    })  # fmt: skip


def _load(tmp_path: Path, cfg: dict):
    from workbench.config import load_study

    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(cfg))
    return load_study(path)


def _train_runs(experiment: str) -> dict:
    import mlflow
    from mlflow.tracking import MlflowClient

    exp = mlflow.get_experiment_by_name(experiment)
    runs = MlflowClient().search_runs([exp.experiment_id], max_results=100)
    return {r.info.run_name: r for r in runs if r.info.run_name.startswith("train/")}


def _series(run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient().get_metric_history(run_id, key))


def test_workers_train_the_same_models_and_log_them(tmp_path, mlflow_store, monkeypatch, one_torch_thread, capsys):
    import torch
    from safetensors.torch import load_file

    from workbench import names
    from workbench.study.pipeline import run_experiment

    trained = {}
    for workers in (1, 2):
        monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path / f"data{workers}"))
        cfg = _load(tmp_path, _study(f"workers{workers}", workers=workers, num_threads=1))
        ctx = run_experiment(cfg)
        trained[workers] = ctx.products["train"]
    out = capsys.readouterr().out
    assert "training 2 models, 2 at a time in worker processes (1 thread(s) each)" in out

    assert set(trained[1]) == set(trained[2]) == {("none", 0), ("soft_token", 0)}
    for job, one in trained[1].items():
        two = trained[2][job]
        assert one.checkpoint != two.checkpoint and one.steps == two.steps == 45
        w1, w2 = load_file(one.checkpoint / "model.safetensors"), load_file(two.checkpoint / "model.safetensors")
        assert w1.keys() == w2.keys()
        for k in w1:
            assert torch.equal(w1[k], w2[k]), (job, k)
        assert one.best_valid_ndcg10 == two.best_valid_ndcg10

    runs1, runs2 = _train_runs("workers1"), _train_runs("workers2")
    assert set(runs1) == set(runs2) == {"train/none/seed0/lr0.003", "train/soft_token/seed0/lr0.003"}
    for name, r2 in runs2.items():
        r1 = runs1[name]
        assert r2.info.status == "FINISHED" and r2.data.tags[names.TAG_CACHE_HIT] == "False"
        for key in (names.TRAIN_LOSS, names.TRAIN_EPOCH_LOSS, names.VALID_NDCG10, names.BEST_VALID_NDCG10):
            s1, s2 = _series(r1.info.run_id, key), _series(r2.info.run_id, key)
            assert s1 and s1 == s2, (name, key, s1, s2)

    # again: every model from the cache, no worker started
    again = run_experiment(_load(tmp_path, _study("workers2", workers=2, num_threads=1)))
    assert "worker processes" not in capsys.readouterr().out
    assert {j: r.checkpoint for j, r in again.products["train"].items()} == {j: r.checkpoint
                                                                           for j, r in trained[2].items()}


def test_sasrec_trains_in_a_worker_as_in_the_evaluate_stage(tmp_path, mlflow_store, monkeypatch, one_torch_thread,
                                                            capsys):
    """With workers the evaluate stage's SASRec trains beside the models (stages/train.py, study/sasrec_models.py):
    the same weights as when the evaluate stage trains it, and its baseline run carries the same curve (replayed
    from the cache entry). Fault: the curve not replayed on a hit -> the series differ (empty); the SASRec jobs left
    out of the workers' queue -> no "trained in a worker" line."""
    import torch

    from workbench.study.pipeline import run_experiment

    models = {}
    for workers in (1, 2):
        monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path / f"data{workers}"))
        cfg = _study(f"sasrec{workers}", workers=workers, num_threads=1)
        cfg.update({"stages": [*STAGES, "evaluate"], "methods": {**cfg["methods"], "run": ["none"]}})
        cfg["evaluation"] = {**cfg["evaluation"], "sasrec_epochs": 2, "signal_ablation": False}
        run_experiment(_load(tmp_path, cfg))
        (entry,) = (tmp_path / f"data{workers}" / "cache" / "sasrec").iterdir()
        models[workers] = torch.load(entry / "model.pt")
    out = capsys.readouterr().out
    assert "and 1 SASRec baseline(s) for the evaluate stage" in out and "trained in a worker" in out
    assert models[1].keys() == models[2].keys() and all(torch.equal(models[1][k], models[2][k]) for k in models[1])
    curves = []
    for workers in (1, 2):
        import mlflow
        from mlflow.tracking import MlflowClient

        exp = mlflow.get_experiment_by_name(f"sasrec{workers}")
        (run,) = [r for r in MlflowClient().search_runs([exp.experiment_id]) if r.info.run_name == "baseline/sasrec/seed0"]
        curves.append(_series(run.info.run_id, "sasrec/valid_ndcg_at_10"))  # the MLflow-safe name
    assert len(curves[0]) == 2 and curves[0] == curves[1]


def test_models_are_evaluated_in_the_workers_as_in_the_evaluate_stage(tmp_path, mlflow_store, monkeypatch,
                                                                       one_torch_thread, capsys):
    """With workers and the evaluate stage in the run, each model's evaluations (its own signal and, for soft_token,
    the shuffled and zeroed ablations) run in the workers once the model is trained (study/model_evals.py), and the
    evaluate stage reads them as cache hits: its table equals the one it computes itself with one worker (one thread
    each way). Fault: the evaluations not queued -> no "evaluated in a worker" line; a worker evaluating every job
    with the own signal -> the evaluate stage computed the ablations itself (stored, not hit): failed."""
    from workbench.study.pipeline import run_experiment

    tables = {}
    for workers in (1, 2):
        monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path / f"data{workers}"))
        cfg = _study(f"evals{workers}", workers=workers, num_threads=1)
        cfg.update({"stages": [*STAGES, "evaluate"]})
        tables[workers] = run_experiment(_load(tmp_path, cfg)).products["evaluate"]
        out = capsys.readouterr().out  # this process's lines (a worker's own go to the terminal)
    # the evaluate stage computed none of the four itself: each was a worker's entry
    assert out.count("cache hit eval/") == 4 and "cache stored eval/" not in out
    assert "then its evaluations" in out
    for name in ("none", "soft_token", "soft_token/shuffled", "soft_token/zeroed"):
        assert f"  {name} seed=0: evaluated in a worker (cached for the evaluate stage)" in out, name
    one, two = tables[1], tables[2]
    assert list(one["method"]) == list(two["method"]) and "soft_token/shuffled" in list(one["method"])
    timed = [c for c in one.columns if "latency" in str(c) or "ms" in str(c)]  # wall times differ run to run
    assert one.drop(columns=timed).equals(two.drop(columns=timed)), (one.drop(columns=timed).compare(
        two.drop(columns=timed)))


EPOCHS = 4  # long enough to signal mid-training (a tiny epoch takes seconds), short enough to finish after


def _long_study(tmp_path: Path, name: str) -> Path:
    cfg = _study(name, workers=2, num_threads=2, epochs=EPOCHS, patience=EPOCHS, max_steps=None)
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(cfg))
    return path


def _workers_once(proc: Proc, line: str) -> list:
    """The main process's two worker processes, once each has printed a line containing `line`."""
    import psutil

    proc.wait_for("worker processes", timeout_s=240)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        kids = [c for c in psutil.Process(proc.p.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        if len(kids) == 2 and sum(line in ln for ln in proc.lines) >= 2:
            return kids
        if proc.p.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"two workers never printed {line!r}; output:\n" + proc.output[-3000:])


def _assert_none_left(kids: list) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(gone(k.pid) for k in kids):
        time.sleep(0.2)
    assert all(gone(k.pid) for k in kids), [k.pid for k in kids if not gone(k.pid)]


def test_sigterm_stops_the_workers_and_the_next_run_resumes(tmp_path):
    path = _long_study(tmp_path, "workers_signal")
    env = {**cli_env(tmp_path), "WORKBENCH_DATA_DIR": str(tmp_path / "data")}
    proc = Proc(["run", str(path)], env, tmp_path)
    kids = _workers_once(proc, " epoch 1: loss")  # both saved their state after epoch 1
    proc.p.send_signal(signal.SIGTERM)
    code = proc.finish()
    assert code == 128 + signal.SIGTERM, proc.output[-3000:]
    _assert_none_left(kids)
    statuses = {r.info.run_name: r.info.status for r in store_runs(tmp_path)}
    assert RUNNING not in statuses.values(), statuses
    assert statuses["workers_signal"] == "KILLED" and statuses["train"] == "KILLED"
    assert not list((tmp_path / "data" / "cache" / "train").glob("*/done.json"))  # stopped, not left to finish

    again = Proc(["run", str(path)], env, tmp_path)
    assert again.finish(timeout_s=300) == 0, again.output[-3000:]
    assert "resuming after epoch" in again.output, again.output[-3000:]
    runs = [r for r in store_runs(tmp_path) if r.info.run_name.startswith("train/")]
    finished = {r.info.run_name for r in runs if r.info.status == "FINISHED"}
    assert finished == {"train/none/seed0/lr0.003", "train/soft_token/seed0/lr0.003"}, finished


def test_a_killed_worker_fails_the_study_with_a_clear_error(tmp_path):
    path = _long_study(tmp_path, "workers_kill")
    env = {**cli_env(tmp_path), "WORKBENCH_DATA_DIR": str(tmp_path / "data")}
    proc = Proc(["run", str(path)], env, tmp_path)
    kids = _workers_once(proc, f"epoch 1/{EPOCHS}] started")
    kids[0].kill()
    code = proc.finish()
    assert code == 1, proc.output[-3000:]
    assert "died (killed, out of memory, or its start failed" in proc.output, proc.output[-3000:]
    assert "run the study again to resume" in proc.output
    _assert_none_left(kids)
    statuses = {r.info.run_name: r.info.status for r in store_runs(tmp_path)}
    assert RUNNING not in statuses.values(), statuses
    assert statuses["workers_kill"] == "FAILED" and statuses["train"] == "FAILED"
    assert "FAILED" in [s for n, s in statuses.items() if n.startswith("train/")], statuses


def test_workers_exit_when_the_main_process_is_killed(tmp_path):
    path = _long_study(tmp_path, "workers_orphaned")
    env = {**cli_env(tmp_path), "WORKBENCH_DATA_DIR": str(tmp_path / "data")}
    proc = Proc(["run", str(path)], env, tmp_path)
    kids = _workers_once(proc, f"epoch 1/{EPOCHS}] started")
    proc.p.kill()
    proc.finish()
    _assert_none_left(kids)  # within 15 s: each checks its parent every workers.PARENT_POLL_S
    assert not list((tmp_path / "data" / "cache" / "train").glob("*/done.json"))


def test_the_workers_take_the_longest_models_first():
    """text before SID streams, the longer context before the shorter, ties in the config's order (fault: the
    config's order kept -> text_history third, this fails)."""
    from workbench.config import load_config
    from workbench.study.stages.train import longest_first

    cfg = load_config(ROOT / "experiments" / "personalization_ml1m.yaml")
    jobs = [(m, s, 0.002) for m in cfg.methods.run for s in (0, 1)]
    order = [m for m, _, _ in longest_first(cfg, jobs)]
    assert order[:4] == ["text_history", "text_history", "none_long", "none_long"]
    assert order[4:] == ["none", "none", "user_sid", "user_sid", "soft_token", "soft_token"]
