"""MLflow tracking: one store, self-describing runs, failures kept.

Store, first that applies (`tracking_uri()`; docs/team-mlflow.md):
  1. `--tracking-uri` of `workbench run | bench | report`;
  2. `tracking.uri` in the experiment file (`run_experiment` and `run_bench` enter `use(cfg.tracking.uri)`);
  3. `MLFLOW_TRACKING_URI` (tests point it at a temporary folder; a team at its server, http://host:5000);
  4. `sqlite:///<repo>/mlruns/mlflow.db` with artifacts under `mlruns/artifacts`.
1 and 2 are one mechanism: the CLI flag is a config override. With an http(s) server started with
`--serve-artifacts` (`make mlflow-server`), artifacts go through the server too: clients need no shared
folder. Telemetry is off (no network).

A study is a parent run per experiment file with child runs per stage or variant:

    with start_run("quickstart", config=cfg, experiment_file=path) as parent:
        with start_run("semantic_ids", parent=parent, tags={...}) as child:
            log_metrics({...})

Every run logs the full config, git commit, package versions and hardware. A run whose body
raises is ended FAILED with the error text as a tag and artifact; what it logged before stays. An
interrupt (Ctrl-C, or SIGTERM/SIGHUP through `signals.install`) ends it KILLED the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from workbench import names, signals
from workbench.paths import REPO_ROOT, mlruns_dir

_VERSION_PACKAGES = (
    "torch", "transformers", "tokenizers", "sentence-transformers", "mlflow", "numpy", "pandas",
    "implicit", "pydantic", "vllm", "sglang", "tensorrt-llm",
)  # fmt: skip


def tracking_uri() -> str:
    """The store runs are read from and written to: `MLFLOW_TRACKING_URI`, set for a command by `use`
    (the config's `tracking.uri` or `--tracking-uri`) or by the user, else the local sqlite file."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    d = mlruns_dir().resolve()
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{d / 'mlflow.db'}"


@contextlib.contextmanager
def use(uri: str | None) -> Iterator[str]:
    """Within the block every read and write goes to `uri` (None: the store the environment selects).

    The one place a config's `tracking.uri` (or `--tracking-uri`) takes effect: `run_experiment`,
    `run_bench` and `workbench report` enter it once, so no call below them takes a URI parameter. It
    scopes `MLFLOW_TRACKING_URI` rather than a module global because MLflow itself mirrors its URI into
    that variable (`mlflow.set_tracking_uri` does, for subprocesses): one source of truth, which child
    processes inherit. On exit the variable and MLflow's current URI are as before, so a notebook or a
    test that runs two configs in one process does not leak the first one's store into the second.
    """
    if not uri:
        yield tracking_uri()
        return
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        yield uri
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
        if "mlflow" in sys.modules:  # MLflow's own current URI (and its env mirror) back to the outer store
            import mlflow

            mlflow.set_tracking_uri(tracking_uri())
            if before is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)


def _mlflow():
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import logging

    import mlflow

    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    mlflow.set_tracking_uri(tracking_uri())
    return mlflow


def get_experiment_id(name: str) -> str:
    mlflow = _mlflow()
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    return mlflow.create_experiment(name, artifact_location=_artifact_location(name))


def _artifact_location(experiment: str) -> str | None:
    """Artifacts beside a local sqlite store (`<db dir>/artifacts/<experiment>`), never in the cwd.

    MLflow's default for a sqlite store is `./mlruns` relative to the working directory, which
    scatters artifacts wherever a notebook or test happens to run. Any other store keeps its default: a
    tracking server started with `--serve-artifacts` (`make mlflow-server`) answers `mlflow-artifacts:/...`,
    so clients upload and download through it and need no shared folder (a local path here would break that).
    """
    uri = tracking_uri()
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri[len("sqlite:///") :])
    return (db.parent / "artifacts" / experiment).resolve().as_uri()


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - not a git checkout (e.g. installed wheel)
        return "unknown"


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in _VERSION_PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def hardware() -> dict[str, Any]:
    """The machine a run measured on: CPU model and the instruction sets that matter (hardware.cpu_info)."""
    from workbench.hardware import cpu_info

    from workbench import malloc

    info: dict[str, Any] = {"machine": platform.machine(), "cpus": os.cpu_count(), "system": platform.system(),
                            **cpu_info(), "malloc_hugepages": malloc.active()}
    try:
        mem = Path("/proc/meminfo").read_text().split()[1]
        info["mem_gib"] = round(int(mem) / 2**20, 1)
    except OSError:
        pass
    if "torch" in __import__("sys").modules:  # don't import torch just to describe the machine
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


@contextlib.contextmanager
def start_run(
    run_name: str,
    *,
    experiment: str | None = None,
    parent=None,
    config=None,
    experiment_file: str | None = None,
    tags: dict[str, str] | None = None,
) -> Iterator[Any]:
    """Start a (child) run that describes itself; end it FAILED, with the error kept, if the body raises.

    `parent` is a parent run (as yielded by this function); children go in the parent's experiment.
    `config` (a pydantic model or dict) is logged as params (flattened) and as `config.json`.
    """
    _mlflow()  # sets the tracking URI the client below uses
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    if parent is not None:
        exp_id = parent.info.experiment_id
    else:
        exp_id = get_experiment_id(experiment or run_name)
    all_tags = {
        names.TAG_GIT_COMMIT: git_commit(),
        "mlflow.runName": run_name,
    }
    if parent is not None:
        all_tags["mlflow.parentRunId"] = parent.info.run_id
    if experiment_file:
        all_tags[names.TAG_EXPERIMENT_FILE] = str(experiment_file)
    from workbench.hardware import cpu_info

    cpu = cpu_info()
    all_tags[names.TAG_CPU] = f"{cpu['cpu_model']} ({cpu['cpu_flags'] or 'no AVX-512'})"
    all_tags.update(tags or {})
    rid = None
    try:
        # no window between creating the run and protecting it: a signal arriving while the run is
        # created is delivered once `rid` is known, inside this `try` (signals.py)
        with signals.deferred():
            run = client.create_run(exp_id, tags=all_tags, run_name=run_name)
            rid = run.info.run_id
        cfg_dict = None
        if config is not None:
            cfg_dict = config.model_dump(mode="json") if hasattr(config, "model_dump") else dict(config)
            from workbench.config import section_hash

            client.set_tag(rid, names.TAG_CONFIG_HASH, section_hash(cfg_dict))
            params = {k: str(v)[:6000] for k, v in _flatten(cfg_dict).items()}
            items = list(params.items())
            from mlflow.entities import Param

            for i in range(0, len(items), 100):
                client.log_batch(rid, params=[Param(k, v) for k, v in items[i : i + 100]])
        client.log_dict(rid, {"versions": package_versions(), "hardware": hardware()}, "environment.json")
        if cfg_dict is not None:
            client.log_dict(rid, cfg_dict, "config.json")
        yield _RunHandle(client, run)
    except BaseException as e:  # KeyboardInterrupt, SIGTERM/SIGHUP (signals.Terminated) too: mark it, keep what was logged
        if rid is not None:
            status = "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED"
            with contextlib.suppress(Exception):
                client.set_tag(rid, names.TAG_ERROR, f"{type(e).__name__}: {e}"[:5000])
                client.log_text(rid, traceback.format_exc(), "error.txt")
            with contextlib.suppress(Exception):
                client.set_terminated(rid, status=status)
        raise
    else:
        client.set_terminated(rid, status="FINISHED")


class _RunHandle:
    """A live run: `.info` like mlflow's Run, plus logging helpers bound to this run id."""

    def __init__(self, client, run):
        self.client = client
        self.info = run.info

    @property
    def run_id(self) -> str:
        return self.info.run_id

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        import math
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [
            Metric(names.metric_name(k), float(v), ts, step or 0)
            for k, v in metrics.items()
            if v is not None and isinstance(v, (int, float)) and math.isfinite(float(v))
        ]
        for i in range(0, len(ms), 500):
            self.client.log_batch(self.run_id, metrics=ms[i : i + 500])

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in _flatten(params).items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def set_tags(self, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def log_dict(self, d: Any, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, json.loads(json.dumps(d, default=str)), artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_figure(self, fig, artifact_file: str) -> None:
        """A plotly figure as standalone HTML with plotly.js embedded (these hosts are offline:
        the CDN script mlflow's own log_figure links to would leave the figure blank)."""
        if artifact_file.endswith(".html") and hasattr(fig, "to_html"):
            self.client.log_text(self.run_id, fig.to_html(include_plotlyjs=True, full_html=True), artifact_file)
        else:
            self.client.log_figure(self.run_id, fig, artifact_file)

    def log_table(self, df, artifact_file: str) -> None:
        """A pandas DataFrame as CSV (human-readable) plus JSON records (machine-readable)."""
        self.client.log_text(self.run_id, df.to_csv(index=False), artifact_file)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)


def ui_hint(run_id: str) -> str:
    uri = tracking_uri()
    if uri.startswith(("http://", "https://")):  # a tracking server: its UI is at the same address
        return f"MLflow run {run_id} on {uri}\n  open the UI: {uri} (search the run id)"
    return (
        f"MLflow run {run_id} in {uri}\n"
        f"  open the UI: .venv/bin/mlflow ui --backend-store-uri {uri} --port 5000  (then http://127.0.0.1:5000)"
    )
