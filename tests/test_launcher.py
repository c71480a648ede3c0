"""The launcher always cleans up: failed start, no health in time, exceptions and Ctrl-C inside the block.

These use small real processes (python's http.server, a process that spawns a child and hangs) so
they run in seconds; the vLLM tests exercise the same launcher on a live `vllm serve`, including a
kill mid-request (test_vllm_engine.py).
"""

from __future__ import annotations

import os
import sys
import time

import httpx
import pytest

from workbench.engines.remote import launcher
from workbench.engines.remote.launcher import LaunchError, ServerSpec, free_port, launch

pytestmark = pytest.mark.timeout(60)


def _group_gone(pgid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _http_server_spec(tmp_path, timeout_s=20.0) -> ServerSpec:
    (tmp_path / "health").write_text("ok")
    port = free_port()
    argv = (sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path))
    return ServerSpec("stand-in", argv, port, {"PYTHONUNBUFFERED": "1"}, startup_timeout_s=timeout_s)


def test_failed_start_raises_with_log_and_leaves_nothing(tmp_path):
    spec = ServerSpec("broken", (sys.executable, "-c", "import sys; print('model failed to load'); sys.exit(3)"),
                      free_port(), startup_timeout_s=20)
    with pytest.raises(LaunchError, match="exited with code 3") as e:
        with launch(spec, log_path=tmp_path / "log.txt"):
            pytest.fail("must not get here")
    assert "model failed to load" in str(e.value)
    assert not launcher._LIVE


def test_no_health_in_time_kills_the_whole_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); print('loading', flush=True); time.sleep(120)")
    spec = ServerSpec("hung", (sys.executable, "-c", code), free_port(), startup_timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="no healthy answer"):
        with launch(spec, log_path=tmp_path / "log.txt") as s:  # noqa: F841
            pass
    assert time.monotonic() - t0 < 30
    pids = [p for p in launcher._LIVE]
    assert not pids
    # the child the "server" spawned is gone too (it was in the server's process group)
    log = (tmp_path / "log.txt").read_text()
    assert "loading" in log
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the server's child process {child} survived the launcher")


def test_healthy_server_is_stopped_on_exception_and_ctrl_c(tmp_path):
    spec = _http_server_spec(tmp_path)
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with launch(spec, log_path=tmp_path / "log.txt") as server:
                assert httpx.get(server.url + "/health").status_code == 200
                pgid = os.getpgid(server.pid)
                raise exc
        assert _group_gone(pgid), "server process group still alive after the block"
        assert not server.alive()


def test_requests_in_flight_fail_when_the_server_dies(tmp_path):
    """A client request to a server that is killed mid-request fails fast instead of hanging."""
    spec = _http_server_spec(tmp_path)
    with launch(spec, log_path=tmp_path / "log.txt") as server:
        os.killpg(os.getpgid(server.pid), 9)
        with pytest.raises(httpx.HTTPError):
            httpx.get(server.url + "/health", timeout=5)


def test_serving_dir_hides_workbench_files(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "projector.safetensors", "catalog.npz",
                 "workbench.json"):
        (ck / name).write_text("x")
    view = launcher.serving_dir(ck)
    assert sorted(p.name for p in view.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (view / "config.json").resolve() == (ck / "config.json").resolve()


def test_vllm_spec_sets_cpu_environment(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("WORKBENCH_VLLM_BIN", str(fake))
    spec = launcher.vllm_spec(ck, "float32", kv_cache_gib=2)
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert spec.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert spec.env["HF_HUB_OFFLINE"] == "1"
    assert "--enable-prompt-embeds" in spec.argv and "--enforce-eager" in spec.argv
    assert spec.argv[spec.argv.index("--port") + 1] == str(spec.port)


def test_missing_environment_says_how_to_build(monkeypatch, tmp_path):
    from workbench.engines.base import EngineUnavailable

    monkeypatch.setenv("WORKBENCH_TRTLLM_BIN", str(tmp_path / "nope"))
    with pytest.raises(EngineUnavailable, match="environments/trtllm.txt"):
        launcher.require_executable("trtllm")
