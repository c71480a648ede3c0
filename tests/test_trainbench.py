"""`workbench trainbench` (perf/trainbench.py) on the tiny study: the JSON it prints and the MLflow run it logs.

- One configuration (text_history, the method with blocks): rates, the matmul share, ms per step by phase adding up
  to the timed wall, the profiled op kinds; one FINISHED run in the experiment `perf` with its headline metrics,
  `perf.json` and the tags the report reads.
- `--ab A B`: both sides on the same windows, per-round ratios, their median; B / A near 1 for two identical
  configurations is not asserted (a timing), only that every round gave one.
- A bad override fails with what is wrong, before anything trains.

Fault injection (by hand): the "optimizer" mark left out of `_Training.optimizer_step` -> that phase reads 0 ->
failed; `record.HEADLINES["train"]` reading a wrong key -> the metric is missing -> failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def study_file(tmp_path, data_dir, mlflow_store):
    from workbench.config import deep_merge
    from workbench.testing import TINY_STUDY_OVERRIDES

    cfg = deep_merge(TINY_STUDY_OVERRIDES, {"base": str(ROOT / "experiments" / "quickstart.yaml"),
                                            "name": "tb", "methods": {"run": ["none", "text_history"]}})
    path = tmp_path / "tb.yaml"
    path.write_text(json.dumps(cfg))
    return path


def _run(capsys, argv):
    from workbench.perf import trainbench

    assert trainbench.main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_one_configuration_json_and_mlflow_run(study_file, capsys):
    import mlflow
    from mlflow.tracking import MlflowClient

    from workbench import names
    from workbench.perf import record, trainbench

    doc = _run(capsys, [str(study_file), "--method", "text_history", "--steps", "3", "--warmup-steps", "1",
                        "--profile-steps", "1", "--threads", "1"])
    assert doc["mode"] == "train" and doc["method"] == "text_history" and doc["steps"] == 3
    assert doc["targets"] > 0 and doc["tokens"] > doc["targets"] and doc["targets_per_s"] > 0
    assert 0 < doc["matmul_share"] < 1 and doc["matmul_gflops"] > 0
    phases = doc["phase_ms_per_step"]
    assert set(phases) == set(trainbench.PHASES) and all(v > 0 for v in phases.values())
    assert sum(phases.values()) <= doc["ms_per_step"] * 1.001  # the phases are parts of the timed steps
    assert sum(phases.values()) >= 0.9 * doc["ms_per_step"]
    ops = doc["ops_ms_per_step"]
    assert ops["forward"].get("matmul", 0) > 0 and ops["backward"].get("attention", 0) > 0
    assert all(trainbench.OVERHEAD in ops[p] for p in trainbench.PHASES)
    exp = mlflow.get_experiment_by_name(names.PERF_EXPERIMENT)
    (run,) = MlflowClient().search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags[names.TAG_PERF_MODE] == "train" and run.data.tags[names.TAG_MODEL_SIZE] == "tb/text_history"
    assert run.data.tags[names.TAG_COMMAND].startswith("workbench trainbench ")
    assert run.data.metrics[names.PERF_TRAIN_TARGETS_PER_S] == pytest.approx(doc["targets_per_s"])
    assert run.data.metrics[names.PERF_TRAIN_MATMUL_SHARE] == pytest.approx(doc["matmul_share"])
    art = json.loads(Path(MlflowClient().download_artifacts(run.info.run_id, record.ARTIFACT)).read_text())
    assert art["mode"] == "train" and art["results"][0]["targets"] == doc["targets"]


def test_ab_alternates_two_configurations_on_the_same_windows(study_file, capsys):
    old_paths = "training.attention=sdpa,training.loss=full"
    doc = _run(capsys, [str(study_file), "--method", "text_history", "--ab", old_paths, "", "--rounds", "2",
                        "--round-steps", "1", "--warmup-steps", "0", "--profile-steps", "0", "--threads", "1",
                        "--no-track"])
    assert doc["mode"] == "train_ab" and len(doc["per_round_ratio"]) == 2
    assert doc["a"]["overrides"] == {"training": {"attention": "sdpa", "loss": "full"}} and doc["b"]["overrides"] == {}
    assert doc["a"]["targets"] == doc["b"]["targets"]  # the same batches, in the same order, on both sides
    r = doc["ratio_b_over_a"]
    assert r["q1"] <= r["median"] <= r["q3"] and r["median"] > 0


@pytest.mark.parametrize("override, says", [("training.batch_targets", "section.key=value"),
                                             ("training.attention=fast", "attention"),
                                             ("batch_targets=4", "section.key=value")])
def test_a_bad_override_says_what_is_wrong(study_file, override, says):
    from workbench.errors import UsageError
    from workbench.perf import trainbench

    with pytest.raises(UsageError, match=says):
        trainbench.main([str(study_file), "--method", "none", "--set", override, "--no-track"])
