"""Signals and faults on the real CLI: nothing orphaned, nothing left RUNNING, the next run works.

- SIGTERM / SIGHUP to `workbench bench` mid-sweep (its `workbench serve` child up): exit 128 + signal,
  no process left on the server's port, every MLflow run ended (KILLED), no temporary folder left.
- SIGTERM to `workbench run` mid-study: exit 143, the parent and stage runs KILLED.
- The server killed (SIGKILL) mid-sweep: the sweep records the failures, the engine's run ends FAILED
  with the points it had, no process left, and the next sweep on the same config works.
- A signal that arrives while `tracking.start_run` is creating its run (the old window): KILLED, not RUNNING.

Each runs the real CLI in a subprocess against a throw-away sqlite MLflow store and temp folder.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from cli_procs import RUNNING, Proc, cli_env, gone, store_runs

pytestmark = pytest.mark.timeout(300)


def _server_children(pid: int) -> list:
    import psutil

    return [c for c in psutil.Process(pid).children(recursive=True) if "serve" in " ".join(c.cmdline())]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _bench_config(tmp: Path, checkpoint: Path, rates: list[float], requests_per_rate: int) -> Path:
    cfg = {
        "name": "signal_test", "engines": [{"name": "torch", "transport": "http", "threads": 1}],
        "tracking": {"experiment": "signal_test"},
        "load": {"workload": "beam_search", "checkpoints": [str(checkpoint)], "prompt_tokens": 24, "beam_width": 4,
                 "max_new_tokens": 3, "rates": rates, "requests_per_rate": requests_per_rate, "warmup_requests": 2,
                 "unloaded_requests": 3, "time_cap_s": 120, "slo_ms": 60000},
        "cost": {"usd_per_hour": 3.6, "reference_engine": "torch"},
    }  # fmt: skip
    path = tmp / "bench.yaml"
    path.write_text(json.dumps(cfg))  # YAML is a superset of JSON
    return path


def _assert_clean(tmp: Path, server_pid: int, port: int) -> None:
    deadline = time.monotonic() + 20
    while not (gone(server_pid) and _port_free(port)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gone(server_pid), f"server pid {server_pid} still running"
    assert _port_free(port), f"port {port} still answers"
    left = list((tmp / "tmpdir").glob("workbench-bench-*"))
    assert not left, f"temporary folders left behind: {left}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_to_bench_stops_server_and_ends_runs(bench_checkpoint, tmp_path, sig):
    path = _bench_config(tmp_path, bench_checkpoint, rates=[2.0, 2.0, 2.0], requests_per_rate=40)
    proc = Proc(["bench", str(path)], cli_env(tmp_path), tmp_path)
    line = proc.wait_for("workbench serve (torch) up at")
    port = int(line.rsplit(":", 1)[1].split()[0])
    (server,) = _server_children(proc.p.pid)
    time.sleep(2.0)  # into the measured requests
    proc.p.send_signal(sig)
    code = proc.finish()
    assert code == 128 + sig, proc.output[-3000:]
    _assert_clean(tmp_path, server.pid, port)
    runs = store_runs(tmp_path)
    assert runs and not [r.info.run_name for r in runs if r.info.status == RUNNING]
    statuses = {r.info.run_name: r.info.status for r in runs}
    assert set(statuses.values()) == {"KILLED"}, statuses
    assert any(signal.Signals(sig).name in r.data.tags.get("workbench.error", "") for r in runs)


def test_server_killed_mid_sweep_fails_the_run_and_the_next_sweep_works(bench_checkpoint, tmp_path):
    path = _bench_config(tmp_path, bench_checkpoint, rates=[4.0, 4.0, 4.0, 4.0], requests_per_rate=12)
    proc = Proc(["bench", str(path)], cli_env(tmp_path), tmp_path)
    line = proc.wait_for("workbench serve (torch) up at")
    port = int(line.rsplit(":", 1)[1].split()[0])
    (server,) = _server_children(proc.p.pid)
    proc.wait_for("[bench] torch: offered")  # the first point is in
    server.kill()
    code = proc.finish()
    assert code == 0, proc.output[-3000:]  # the sweep goes on past a failed engine and says so
    assert "FAILED" in proc.output and "every request" in proc.output
    _assert_clean(tmp_path, server.pid, port)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = store_runs(tmp_path)
    assert not [r for r in runs if r.info.status == RUNNING]
    (child,) = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert child.info.status == "FAILED" and "every request" in child.data.tags["workbench.error"]
    points = client.get_metric_history(child.info.run_id, "load/offered_qps")
    assert len(points) >= 1  # the points it had (the first one, at least) stay logged
    failures = client.get_metric_history(child.info.run_id, "load/failures")
    assert max(f.value for f in failures) > 0  # the failures are recorded
    assert "points.csv" in {a.path for a in client.list_artifacts(child.info.run_id)}
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "server_logs")] == ["server_logs/torch-server.log"]

    again = Proc(["bench", str(path)], cli_env(tmp_path), tmp_path)
    assert again.finish(timeout_s=240) == 0, again.output[-3000:]
    newest = [r for r in store_runs(tmp_path) if "mlflow.parentRunId" in r.data.tags and r.info.run_id != child.info.run_id]
    assert [r.info.status for r in newest] == ["FINISHED"]


def test_sigterm_to_run_marks_every_run_killed(tmp_path):
    from workbench.testing import TINY_STUDY_OVERRIDES

    repo = Path(__file__).resolve().parents[1]
    cfg = {"base": str(repo / "experiments" / "quickstart.yaml"), **TINY_STUDY_OVERRIDES,
           "name": "signal_run_test", "tracking": {"experiment": "signal_run_test"}}
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(cfg))
    env = {**cli_env(tmp_path), "WORKBENCH_DATA_DIR": str(tmp_path / "data")}
    proc = Proc(["run", str(path)], env, tmp_path)
    proc.wait_for("] train")
    proc.p.send_signal(signal.SIGTERM)
    code = proc.finish()
    assert code == 128 + signal.SIGTERM, proc.output[-3000:]
    assert "run KILLED" in proc.output
    runs = store_runs(tmp_path)
    statuses = {r.info.run_name: r.info.status for r in runs}
    assert RUNNING not in statuses.values(), statuses
    assert statuses["signal_run_test"] == "KILLED" and statuses["train"] == "KILLED"
    assert statuses["data"] == "FINISHED"  # what finished stays finished


def test_signal_while_run_is_created_is_not_lost(mlflow_store, monkeypatch):
    """A Ctrl-C arriving inside `create_run` (the old window) is delivered once the run is protected."""
    from mlflow.tracking import MlflowClient

    from workbench import tracking

    real = MlflowClient.create_run

    def create_then_interrupt(self, *a, **kw):
        run = real(self, *a, **kw)
        os.kill(os.getpid(), signal.SIGINT)  # lands before create_run returns to start_run
        return run

    monkeypatch.setattr(MlflowClient, "create_run", create_then_interrupt)
    # Python's own Ctrl-C handler, whatever an earlier test or library left in place
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with tracking.start_run("window_test", experiment="window_test"):
                pytest.fail("the interrupt should have been delivered before the body")
    finally:
        signal.signal(signal.SIGINT, old)
    monkeypatch.setattr(MlflowClient, "create_run", real)
    (run,) = MlflowClient(mlflow_store).search_runs([tracking.get_experiment_id("window_test")])
    assert run.info.status == "KILLED"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_to_serve_shuts_down_cleanly(bench_checkpoint, tmp_path, sig):
    from workbench.engines.remote.launcher import free_port

    port = free_port()
    proc = Proc(["serve", "--checkpoint", str(bench_checkpoint), "--port", str(port)], cli_env(tmp_path), tmp_path)
    proc.wait_for("Uvicorn running on")
    proc.p.send_signal(sig)
    assert proc.finish() == 128 + sig, proc.output[-3000:]
    assert "Finished server process" in proc.output  # uvicorn's graceful path: the lifespan closed the engine
    assert _port_free(port)
