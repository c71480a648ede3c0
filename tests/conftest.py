"""Shared fixtures: every test gets its own data folder and a real, temporary MLflow store."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch/OpenMP thread per test process: the suite shares 2 cores with a vLLM server, and
# OpenMP's spin-waiting makes a 2-thread torch up to 100x slower when a core is busy elsewhere.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """A real sqlite MLflow store in a temp folder; returns its tracking URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("WORKBENCH_MLRUNS_DIR", str(tmp_path / "mlruns"))
    return uri


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    d = tmp_path / "data"
    d.mkdir()
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(d))
    return d
