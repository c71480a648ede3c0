"""MLflow tracking into a real temporary store: self-describing runs, failures kept."""

from __future__ import annotations

import pytest

from workbench import names, tracking
from workbench.config import parse_config


def _client():
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking.tracking_uri())


def test_parent_child_runs_describe_themselves(mlflow_store):
    cfg = parse_config({"name": "t", "dataset": {"name": "ml-100k"}})
    with tracking.start_run("t", config=cfg, experiment_file="x.yaml") as parent:
        with tracking.start_run("stage", parent=parent, tags={names.TAG_STAGE: "data"}) as child:
            child.log_metrics({"a/b": 1.5, "a/nan": float("nan")})
    c = _client()
    p, ch = c.get_run(parent.run_id), c.get_run(child.run_id)
    assert p.info.status == "FINISHED" and ch.info.status == "FINISHED"
    assert ch.data.tags["mlflow.parentRunId"] == parent.run_id
    assert p.data.params["dataset.name"] == "ml-100k"
    assert p.data.tags[names.TAG_GIT_COMMIT]
    assert ch.data.metrics == {"a/b": 1.5}  # NaN is dropped, not logged as garbage
    arts = {a.path for a in c.list_artifacts(parent.run_id)}
    assert {"config.json", "environment.json"} <= arts
    env = c.download_artifacts(parent.run_id, "environment.json")
    import json

    d = json.loads(open(env).read())
    assert d["versions"]["mlflow"] == "3.17.2" and d["hardware"]["cpus"] >= 1


def test_failed_run_is_marked_and_keeps_work(mlflow_store):
    with pytest.raises(RuntimeError):
        with tracking.start_run("t") as parent:
            with tracking.start_run("ok", parent=parent) as ok:
                ok.log_metrics({"done": 1})
            with tracking.start_run("bad", parent=parent) as bad:
                bad.log_metrics({"partial": 2})
                raise RuntimeError("boom")
    c = _client()
    assert c.get_run(ok.run_id).info.status == "FINISHED"
    b = c.get_run(bad.run_id)
    assert b.info.status == "FAILED" and b.data.metrics["partial"] == 2
    assert "boom" in b.data.tags["workbench.error"]
    assert c.get_run(parent.run_id).info.status == "FAILED"


def test_use_scopes_the_store_and_restores_it(mlflow_store, tmp_path):
    """`tracking.use` (a config's tracking.uri) sends every write there, then puts the outer store back:
    the environment, MLflow's current URI (which MLflow mirrors into the environment) and `tracking_uri()`."""
    import os

    import mlflow
    from mlflow.tracking import MlflowClient

    other = f"sqlite:///{tmp_path / 'other.db'}"
    with tracking.use(other) as uri:
        assert uri == other == tracking.tracking_uri()
        with tracking.start_run("t", experiment="elsewhere") as run:
            run.log_metrics({"x": 1})
    assert tracking.tracking_uri() == mlflow_store == os.environ["MLFLOW_TRACKING_URI"]
    assert mlflow.get_tracking_uri() == mlflow_store
    assert MlflowClient(other).get_run(run.run_id).info.status == "FINISHED"
    assert MlflowClient(mlflow_store).get_experiment_by_name("elsewhere") is None
    with tracking.use(None) as uri:  # no tracking.uri in the config: the environment's store
        assert uri == mlflow_store


def test_use_without_env_var_leaves_none_behind(monkeypatch, tmp_path):
    import os

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WORKBENCH_MLRUNS_DIR", str(tmp_path / "mlruns"))
    with tracking.use(f"sqlite:///{tmp_path / 'x.db'}"):
        tracking._mlflow()  # MLflow sets MLFLOW_TRACKING_URI itself
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert tracking.tracking_uri() == f"sqlite:///{(tmp_path / 'mlruns').resolve() / 'mlflow.db'}"


def test_run_experiment_honours_tracking_uri(mlflow_store, tmp_path, monkeypatch):
    """The config key beats MLFLOW_TRACKING_URI (here the test's store), in process as in notebooks."""
    from mlflow.tracking import MlflowClient

    from workbench.study import pipeline

    monkeypatch.setitem(pipeline.STAGES, "data", lambda ctx: None)  # tracking only: no data needed
    other = f"sqlite:///{tmp_path / 'team.db'}"
    cfg = parse_config({"name": "keyed", "dataset": {"name": "ml-100k"}, "tracking": {"uri": other}})
    ctx = pipeline.run_experiment(cfg, stages=["data"])
    run = MlflowClient(other).get_run(ctx.parent.run_id)
    assert run.info.status == "FINISHED" and run.data.params["tracking.uri"] == other
    assert MlflowClient(mlflow_store).get_experiment_by_name("keyed") is None
    assert tracking.tracking_uri() == mlflow_store


def test_cli_flag_beats_config_key(tmp_path):
    """Precedence: --tracking-uri > tracking.uri > MLFLOW_TRACKING_URI > local sqlite (the flag is a config
    override, so it takes the key's path and validation)."""
    import yaml

    from workbench.cli import _tracking_override, build_parser
    from workbench.config import load_study, load_sweep

    study = tmp_path / "s.yaml"
    keyed = {"name": "s", "dataset": {"name": "ml-100k"}, "tracking": {"uri": "sqlite:///a.db"}}
    study.write_text(yaml.safe_dump(keyed))
    sweep = tmp_path / "w.yaml"
    sweep.write_text(yaml.safe_dump({"name": "w", "load": {}}))
    p = build_parser()
    flag = ["--tracking-uri", "http://127.0.0.1:5000"]
    assert load_study(study, _tracking_override(p.parse_args(["run", str(study), *flag]))).tracking.uri == flag[1]
    assert load_study(study, _tracking_override(p.parse_args(["run", str(study)]))).tracking.uri == "sqlite:///a.db"
    assert load_sweep(sweep, _tracking_override(p.parse_args(["bench", str(sweep), *flag]))).tracking.uri == flag[1]
    assert p.parse_args(["report", "--experiment", "x", "-o", "o.html", *flag]).tracking_uri == flag[1]


def test_artifacts_beside_sqlite_only(monkeypatch, tmp_path):
    """A local sqlite store keeps artifacts beside it; a server (http) or another store chooses its own."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    assert tracking._artifact_location("e") == (tmp_path / "artifacts" / "e").resolve().as_uri()
    for uri in ("http://127.0.0.1:5000", "postgresql+psycopg://u@/db?host=/tmp"):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert tracking._artifact_location("e") is None
