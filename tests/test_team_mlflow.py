"""A team MLflow server for real: PostgreSQL store, artifacts through the server, the workbench pointed at it.

One throw-away server for the module, started by `scripts/mlflow_server.sh` (what `make mlflow-server`
runs) in a temporary folder: initdb there, PostgreSQL on a socket in that folder, `mlflow server
--serve-artifacts` on a free loopback port. Then, each through the real CLI in a subprocess:

- a tiny study (`workbench run`, stages data -> semantic_ids) with `MLFLOW_TRACKING_URI=http://...`;
- a tiny load sweep (`workbench bench`) whose file says `tracking.uri: http://...` while the environment
  points at a local sqlite decoy: the config key must win, and the decoy stay empty;
- `workbench report` from the server, by the environment variable and by `--tracking-uri`.

Runs are checked on the server (FINISHED, metrics, artifacts downloaded over HTTP and present in the
server's artifact folder, none in a local store); the last test stops the server and checks that no
process of it is left. Skipped, saying why, where PostgreSQL is not installed (.ci/run installs it).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from workbench import names
from workbench.config import deep_merge
from workbench.testing import TINY_STUDY_OVERRIDES

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "mlflow_server.sh"
STUDY_EXP, SWEEP_EXP = "team_study", "team_sweep"


def _postgres_missing() -> str | None:
    """Why this machine cannot run the test, or None: the server binaries, and as root an unprivileged user."""
    found = shutil.which("initdb") or any(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        return ("PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin): "
                "apt-get install -y postgresql")
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a `postgres` user for initdb (Debian's postgresql package creates it)"
    return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(_postgres_missing() is not None, reason=str(_postgres_missing())),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _script(action: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), action], env=env, capture_output=True, text=True, timeout=300)


class Server:
    """The module's server: its URL, its folder and the environment that `scripts/mlflow_server.sh` reads."""

    def __init__(self, base: Path):
        self.base = base
        self.dir = base / "srv"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "MLFLOW_SERVER_DIR": str(self.dir), "HOST": "127.0.0.1", "PORT": str(self.port),
                    "WORKERS": "1", "MLFLOW": str(Path(sys.executable).parent / "mlflow")}

    def start(self) -> subprocess.CompletedProcess:
        out = _script("start", self.env)
        if out.returncode != 0:
            logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}"
                           for p in sorted((self.dir / "logs").glob("*.log")))
            pytest.fail(f"mlflow_server.sh start failed ({out.returncode}):\n{out.stderr}{logs}")
        return out

    def stop(self) -> subprocess.CompletedProcess:
        return _script("stop", self.env)

    def processes(self) -> list:
        """This server's live processes: PostgreSQL's postmaster and its children (their titles do not name
        the folder), MLflow's process group (server, uvicorn workers), and any command line naming the folder."""
        import psutil

        found: dict[int, psutil.Process] = {}
        pid_file = self.dir / "pg" / "postmaster.pid"
        if pid_file.exists():
            with contextlib.suppress(psutil.NoSuchProcess, ValueError):
                pm = psutil.Process(int(pid_file.read_text().split()[0]))
                found.update({p.pid: p for p in [pm, *pm.children(recursive=True)]})
        group = int((self.dir / "mlflow.pid").read_text()) if (self.dir / "mlflow.pid").exists() else None
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                if str(self.dir) in " ".join(p.info["cmdline"] or []) or (group and os.getpgid(p.pid) == group):
                    found[p.pid] = p
        return [p for p in found.values() if _alive(p)]


def _alive(p) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def server():
    # not pytest's tmp_path: as root, PostgreSQL runs as `postgres`, which must be able to enter the folder
    base = Path(tempfile.mkdtemp(prefix="wb-team-mlflow-"))
    base.chmod(0o711)
    srv = Server(base)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()  # idempotent: test_stop_leaves_no_process has normally stopped it already
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The clients' side: data folder, a local MLflow folder that must stay empty, a sqlite decoy store."""
    d = tmp_path_factory.mktemp("team_clients")
    (d / "data").mkdir()
    return d


def _client(server: Server):
    from mlflow.tracking import MlflowClient

    return MlflowClient(server.url)


def _cli(args: list[str], work: Path, **env: str) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess; MLflow's store comes only from `env` and the arguments."""
    full = {**os.environ, "WORKBENCH_DATA_DIR": str(work / "data"), "WORKBENCH_MLRUNS_DIR": str(work / "mlruns"),
            "OMP_NUM_THREADS": "1"}
    full.pop("MLFLOW_TRACKING_URI", None)
    full.update(env)
    out = subprocess.run([sys.executable, "-m", "workbench.cli", *args], env=full, cwd=work, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, f"workbench {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-4000:]}"
    return out


def _runs(client, experiment: str) -> list:
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} on the server"
    return client.search_runs([exp.experiment_id])


def _on_server_disk(server: Server, run) -> Path:
    """The folder the server keeps a run's artifacts in (mlflow-artifacts:/<exp>/<run>/artifacts)."""
    uri = run.info.artifact_uri
    assert uri.startswith("mlflow-artifacts:/"), f"artifacts of {run.info.run_id} not served by the server: {uri}"
    return server.dir / "artifacts" / uri[len("mlflow-artifacts:/"):].lstrip("/")


def test_study_logs_to_the_server_by_env_var(server, work):
    cfg = deep_merge(TINY_STUDY_OVERRIDES, {"base": str(ROOT / "experiments" / "quickstart.yaml"), "name": "team_study",
                                            "stages": ["data", "embeddings", "semantic_ids"],
                                            "tracking": {"experiment": STUDY_EXP}})
    path = work / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = _cli(["run", str(path)], work, MLFLOW_TRACKING_URI=server.url)
    assert server.url in out.stderr + out.stdout  # the UI hint names the server

    c = _client(server)
    runs = _runs(c, STUDY_EXP)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    children = {r.data.tags["mlflow.runName"]: r for r in runs if r is not parent}
    assert set(children) == {"data", "embeddings", "semantic_ids"}
    assert {r.info.status for r in runs} == {"FINISHED"}
    for name, r in children.items():
        assert r.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert r.data.metrics[f"time/stage_{name}_s"] >= 0
    assert parent.data.params["dataset.name"] == "ml-100k"
    assert c.get_experiment_by_name(STUDY_EXP).artifact_location.startswith("mlflow-artifacts:")

    # artifacts: listed and downloaded through the server, stored in its folder, none in a local store
    assert {"config.json", "environment.json", "stages.json"} <= {a.path for a in c.list_artifacts(parent.info.run_id)}
    got = json.loads(Path(c.download_artifacts(parent.info.run_id, "config.json", str(work))).read_text())
    assert got["name"] == "team_study" and got["tracking"]["experiment"] == STUDY_EXP
    assert (_on_server_disk(server, parent) / "stages.json").is_file()
    assert not (work / "mlruns").exists()  # neither the local sqlite store nor MLflow's ./mlruns default


def _sweep_yaml(work: Path, checkpoint: Path, uri: str) -> Path:
    cfg = {
        "name": "bench_team", "engines": [{"name": "torch"}],
        "tracking": {"experiment": SWEEP_EXP, "uri": uri},
        "load": {"workload": "beam_search", "checkpoints": [str(checkpoint)], "prompt_tokens": 24, "beam_width": 4,
                 "max_new_tokens": 3, "rates": [4.0, 12.0], "requests_per_rate": 12, "warmup_requests": 2,
                 "unloaded_requests": 3, "time_cap_s": 60},
        "cost": {"usd_per_hour": 3.6, "reference_engine": "torch"},
    }  # fmt: skip
    path = work / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_sweep_logs_to_the_server_by_config_key(server, work, bench_checkpoint):
    decoy = work / "decoy.db"
    _cli(["bench", str(_sweep_yaml(work, bench_checkpoint, server.url))], work,
         MLFLOW_TRACKING_URI=f"sqlite:///{decoy}")  # the file's tracking.uri wins over the environment

    c = _client(server)
    runs = _runs(c, SWEEP_EXP)
    (parent,) = [r for r in runs if r.data.tags.get(names.TAG_STAGE) == names.STAGE_LOAD_SWEEP]
    (child,) = [r for r in runs if r.data.tags.get(names.TAG_STAGE) == names.STAGE_LOAD]
    assert parent.info.status == child.info.status == "FINISHED"
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert parent.data.params["tracking.uri"] == server.url
    hist = c.get_metric_history(child.info.run_id, names.OFFERED_RATE)
    assert sorted((h.step, h.value) for h in hist) == [(0, 4.0), (1, 12.0)]
    assert all(h.value > 0 for h in c.get_metric_history(child.info.run_id, names.E2E_P99))

    summary = Path(c.download_artifacts(parent.info.run_id, "summary.csv", str(work))).read_text()
    rows = list(csv.DictReader(io.StringIO(summary)))
    assert len(rows) == 1 and rows[0]["run_id"] == child.info.run_id
    assert (_on_server_disk(server, child) / "records.csv").is_file()
    if decoy.exists():  # the environment's store got nothing
        from mlflow.tracking import MlflowClient

        assert MlflowClient(f"sqlite:///{decoy}").get_experiment_by_name(SWEEP_EXP) is None


def _table_rows(html_text: str) -> list[list[str]]:
    """Every row of every table in the report, as cell texts (the layout around the tables may change)."""
    from html.parser import HTMLParser

    rows: list[list[str]] = []

    class Rows(HTMLParser):
        cell: list[str] | None = None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                rows.append([])
            elif tag in ("td", "th"):
                self.cell = []

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self.cell is not None and rows:
                rows[-1].append("".join(self.cell).strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell.append(data)

    Rows().feed(html_text)
    return rows


def _load_rows(html_text: str, workload: str = "beam_search/p24/b4/n3/u") -> list[list[str]]:
    """The report's summary rows of finished load runs of `workload` (rate-point rows carry no status)."""
    return [r for r in _table_rows(html_text) if workload in r and "FINISHED" in r]


def test_report_reads_the_server(server, work):
    c = _client(server)
    sweep = [r for r in _runs(c, SWEEP_EXP) if r.data.tags.get(names.TAG_STAGE) == names.STAGE_LOAD_SWEEP][0]

    out = work / "report_env.html"
    _cli(["report", "--experiment", f"{SWEEP_EXP},{STUDY_EXP}", "-o", str(out)], work, MLFLOW_TRACKING_URI=server.url)
    text = out.read_text()
    assert f"<code>{server.url}</code>" in text  # the store it read
    assert len(_load_rows(text)) == 1  # the sweep's one load run, in the summary table
    assert sweep.info.run_id in text and "bench_team" in text  # the sweep's config.json, fetched from the server

    # --tracking-uri wins over the environment (here a store without the experiment)
    out2 = work / "report_flag.html"
    _cli(["report", "--experiment", SWEEP_EXP, "--tracking-uri", server.url, "-o", str(out2)], work,
         MLFLOW_TRACKING_URI=f"sqlite:///{work / 'decoy.db'}")
    assert f"<code>{server.url}</code>" in out2.read_text() and len(_load_rows(out2.read_text())) == 1


def test_second_start_is_idempotent(server):
    before = (server.dir / "mlflow.pid").read_text()
    out = server.start()
    assert "already running" in out.stderr and "already started" in out.stderr
    assert (server.dir / "mlflow.pid").read_text() == before
    assert f"MLFLOW_TRACKING_URI={server.url}" in out.stdout


def test_stop_leaves_no_process(server):
    import psutil

    procs = server.processes()
    assert len(procs) >= 3, f"PostgreSQL and the MLflow server should be running: {procs}"
    out = server.stop()
    assert out.returncode == 0, out.stderr
    assert "MLflow server stopped" in out.stderr and "PostgreSQL stopped" in out.stderr
    psutil.wait_procs(procs, timeout=10)
    left = [p for p in procs if _alive(p)] + server.processes()
    assert left == [], f"processes left after stop: {left}"
    assert not (server.dir / "mlflow.pid").exists()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
