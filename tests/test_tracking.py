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
