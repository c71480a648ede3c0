"""The real CLI in a subprocess, for the tests that signal or kill it (test_signals.py, test_train_workers.py).

`Proc` runs `python -m workbench.cli ...` with its output read line by line on a thread (so a test can wait for a
line); `cli_env` gives it a throw-away sqlite MLflow store and temp folder; `store_runs` reads that store back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

RUNNING = "RUNNING"


def cli_env(tmp: Path) -> dict:
    (tmp / "tmpdir").mkdir(exist_ok=True)
    return {
        **os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}", "WORKBENCH_MLRUNS_DIR": str(tmp / "mlruns"),
        "TMPDIR": str(tmp / "tmpdir"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
    }  # fmt: skip


class Proc:
    """A CLI subprocess whose stderr is read line by line on a thread (so waits can watch for lines)."""

    def __init__(self, argv: list[str], env: dict, cwd: Path):
        self.p = subprocess.Popen([sys.executable, "-m", "workbench.cli", *argv], env=env, cwd=cwd, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float = 180.0) -> str:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            hit = next((ln for ln in self.lines if text in ln), None)
            if hit is not None:
                return hit
            if self.p.poll() is not None:
                self._t.join(5)
                break
            time.sleep(0.1)
        raise AssertionError(f"no line with {text!r} (exit {self.p.poll()}); output:\n" + "\n".join(self.lines[-40:]))

    def finish(self, timeout_s: float = 120.0) -> int:
        code = self.p.wait(timeout=timeout_s)
        self._t.join(5)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def store_runs(tmp: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    exps = client.search_experiments()
    return client.search_runs([e.experiment_id for e in exps], max_results=200)
