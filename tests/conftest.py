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


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch intra-op thread for the module that asks for it (the previous count is restored after it).

    On a shared 2-core machine OpenMP spin-waiting makes 2 threads up to ~100x slower when a core is busy
    elsewhere; the tiny models of the tests are as fast on one thread. Module-scoped so that module-scoped
    fixtures (training, sweeps) can depend on it too.
    """
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def bench_checkpoint(tmp_path_factory):
    """A tiny random checkpoint for load sweeps and reports: 60 items with 4x4 SIDs, no soft-token projector.

    Session-scoped: it is only read (tests that write next to a checkpoint build their own).
    """
    from workbench.testing import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("bench_ckpt") / "tiny", hidden_size=32, n_items=60,
                                  levels=(4, 4), vocab_base=120, soft_token=False, max_position_embeddings=256)
