"""A data folder moved to another path keeps every cache entry: its checkpoints and their evaluations.

The long ML-1M runs keep their caches across sessions and machines (a GPU host's cache brought home, a worktree's
cache kept for the next session) by copying `data/` elsewhere and pointing `WORKBENCH_DATA_DIR` at it. A train
entry's done.json holds the absolute path it was written with, and an evaluation's key named its checkpoint the
same way: after a move the old path is gone, so the study would retrain hours of models. Now a train entry's
checkpoint is its own `checkpoint/` folder (`TrainResult.from_entry`) and an evaluation names a study checkpoint by
its place in the data folder (`model_evals.checkpoint_ref`).

Fault injection (by hand): `from_entry` returning the stored absolute path -> "stored entry unreadable ...
recomputing" and a retrained model (this test fails on "cache stored train/"); `checkpoint_ref` returning the
absolute path -> the evaluations recompute ("cache stored eval/").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_moved_data_folder_reuses_its_models_and_evaluations(tmp_path, mlflow_store, monkeypatch,
                                                              one_torch_thread, capsys):
    from workbench.config import deep_merge, load_study
    from workbench.study.pipeline import run_experiment
    from workbench.testing import TINY_STUDY_OVERRIDES

    cfg = deep_merge(TINY_STUDY_OVERRIDES, {
        "base": str(ROOT / "experiments" / "quickstart.yaml"), "name": "cache_move",
        "tracking": {"experiment": "cache_move"}, "training": {"max_steps": 8},
        "methods": {"run": ["none"]}, "evaluation": {"signal_ablation": False},
    })  # fmt: skip
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(cfg))

    first, moved = tmp_path / "first" / "data", tmp_path / "elsewhere" / "data"
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(first))
    run_experiment(load_study(path))
    out = capsys.readouterr().out
    assert "cache stored train/" in out and "cache stored eval/" in out

    moved.parent.mkdir()
    shutil.move(first, moved)  # the old path is gone, as on another machine
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(moved))
    again = run_experiment(load_study(path))
    out = capsys.readouterr().out
    assert "cache stored" not in out and "unreadable" not in out, out
    assert "cache hit train/" in out and "cache hit eval/" in out
    (res,) = again.products["train"].values()
    assert res.checkpoint.is_relative_to(moved) and (res.checkpoint / "model.safetensors").exists()
