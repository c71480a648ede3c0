"""The staged pipeline on real ML-100K: products, caching by config hash, MLflow runs (incl. FAILED)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import names
from workbench.config import parse_config


def _cfg(**over):
    data = {
        "name": "pipeline_test",
        "seed": 0,
        "dataset": {"name": "ml-100k"},
        "split": {"max_history": 50},
        "embeddings": {"als_factors": 8, "als_iterations": 3, "als_alpha": 5.0},
        "semantic_ids": {
            "kind": "rq_kmeans", "also_fit": ["rq_vae"], "item_vectors": "collab", "levels": 2,
            "codebook_size": 8, "kmeans_iters": 10, "vae_epochs": 2, "vae_hidden": 16, "vae_latent": 4,
        },
        "user_sids": {"kind": "rq_kmeans", "levels": 2, "codebook_size": 4, "kmeans_iters": 10},
        "stages": ["data", "embeddings", "semantic_ids"],
    }  # fmt: skip
    for k, v in over.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) else v
    return parse_config(data)


def _runs(experiment: str):
    import mlflow
    from mlflow.tracking import MlflowClient

    exp = mlflow.get_experiment_by_name(experiment)
    runs = MlflowClient().search_runs([exp.experiment_id], max_results=100)
    return runs


def test_run_products_cache_and_mlflow(data_dir, mlflow_store, capsys):
    from workbench.study.pipeline import run_experiment

    cfg = _cfg()
    ctx = run_experiment(cfg, experiment_file="experiments/test.yaml")
    out = capsys.readouterr().out
    assert "parent run id:" in out and "mlflow ui" in out

    # products
    ds, sp = ctx.dataset, ctx.split
    assert (ds.n_users, ds.n_items) == (943, 1682)
    assert ctx.als.user_factors.shape == (943, 8) and ctx.text_vectors is None  # collab: no text model
    assert set(ctx.item_sids) == {"rq_kmeans", "rq_vae"}
    assert ctx.item_codes.shape == (1682, 3) and len(np.unique(ctx.item_codes, axis=0)) == 1682
    assert ctx.dedup_size >= ctx.item_codes[:, -1].max() + 1
    assert ctx.catalog.n_items == 1682 and ctx.user_codes.shape == (943, 2)
    layout = ctx.layout(1000)
    assert layout.item_codebooks == (8, 8) and layout.user_codebooks == (4, 4)
    cat = ctx.catalog_for(1000)
    assert cat.item_of(cat.sid_tokens(123)) == 123 and min(cat.sid_tokens(0)) >= 1000
    # user SIDs "as of" the full train history are the stored ones; a short prefix can differ
    seqs = sp.train_sequences()
    np.testing.assert_array_equal(ctx.user_codes_as_of(seqs[:50]), ctx.user_codes[:50])
    assert ctx.user_vectors_as_of([seqs[0][:3]]).shape == (1, 8)
    stats = ctx.stats["semantic_ids"]
    for key in (names.SID_COLLISION_RATE, names.SID_MAX_GROUP, names.SID_QUANT_ERROR, names.sid_utilization(0),
                names.USER_SID_SHARED, "sid_rq_vae/collision_rate"):  # fmt: skip
        assert key in stats, key
    assert 0 < stats[names.sid_utilization(0)] <= 1

    # MLflow: a parent and one FINISHED child per stage, with metrics and figures
    runs = _runs("pipeline_test")
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    assert sorted(r.data.tags[names.TAG_STAGE] for r in children) == ["data", "embeddings", "semantic_ids"]
    assert all(r.info.status == "FINISHED" for r in children)
    sid_run = next(r for r in children if r.data.tags[names.TAG_STAGE] == "semantic_ids")
    assert sid_run.data.metrics[names.SID_COLLISION_RATE] == pytest.approx(stats[names.SID_COLLISION_RATE])
    from mlflow.tracking import MlflowClient

    arts = [a.path for a in MlflowClient().list_artifacts(sid_run.info.run_id, "figures")]
    assert "figures/sid_utilization.html" in arts and "figures/sid_items_per_prefix.html" in arts
    data_run = next(r for r in children if r.data.tags[names.TAG_STAGE] == "data")
    assert data_run.data.metrics["data/n_items"] == 1682

    # second run: every stage is a cache hit and gives the same codes
    again = run_experiment(cfg)
    assert again.cache_hits == {"data": True, "embeddings": True, "semantic_ids": True}
    np.testing.assert_array_equal(again.item_codes, ctx.item_codes)
    np.testing.assert_array_equal(again.user_codes, ctx.user_codes)
    assert again.keys == ctx.keys

    # a changed semantic-id knob recomputes that stage only
    changed = run_experiment(_cfg(semantic_ids={"codebook_size": 16}))
    assert changed.cache_hits == {"data": True, "embeddings": True, "semantic_ids": False}
    assert changed.keys["semantic_ids"] != ctx.keys["semantic_ids"] and changed.item_codes[:, :2].max() >= 8


def test_failing_stage_marks_failed_and_keeps_earlier(data_dir, mlflow_store, monkeypatch):
    from workbench.study import pipeline

    def boom(ctx):
        ctx.run.log_metrics({"partial/progress": 1.0})
        raise RuntimeError("quantizer exploded")

    monkeypatch.setitem(pipeline.STAGES, "semantic_ids", boom)
    with pytest.raises(RuntimeError, match="exploded"):
        pipeline.run_experiment(_cfg(name="failing"))
    runs = _runs("failing")
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    by_stage = {r.data.tags.get(names.TAG_STAGE): r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert parent.info.status == "FAILED"
    assert by_stage["data"].info.status == "FINISHED" and by_stage["embeddings"].info.status == "FINISHED"
    assert by_stage["semantic_ids"].info.status == "FAILED"
    assert "quantizer exploded" in by_stage["semantic_ids"].data.tags["workbench.error"]
    assert by_stage["semantic_ids"].data.metrics["partial/progress"] == 1.0
    assert by_stage["data"].data.metrics["data/n_users"] == 943


def test_resolve_stages_and_untracked_prepare(data_dir, monkeypatch):
    from workbench.study import pipeline

    assert pipeline.resolve_stages(["semantic_ids"]) == ["data", "embeddings", "semantic_ids"]
    assert pipeline.resolve_stages(["evaluate", "data"]) == ["data", "embeddings", "semantic_ids", "train", "evaluate"]
    with pytest.raises(ValueError, match="valid stages"):
        pipeline.resolve_stages(["quantize"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////nonexistent/dir/should-not-be-used.db")
    ctx = pipeline.prepare_context(_cfg(), stages=["data"])  # no MLflow at all
    assert ctx.dataset.n_items == 1682 and ctx.als is None


def test_cli_run_data_stage(data_dir, mlflow_store, tmp_path, capsys):
    from workbench.cli import main

    f = tmp_path / "tiny.yaml"
    f.write_text("name: tiny_cli\ndataset:\n  name: ml-100k\nstages: [data]\n")
    assert main(["run", str(f)]) == 0
    out = capsys.readouterr().out
    assert "[1/1] data" in out and "parent run id:" in out
    runs = _runs("tiny_cli")
    assert {r.data.tags.get(names.TAG_EXPERIMENT_FILE) for r in runs if "mlflow.parentRunId" not in r.data.tags} == {str(f)}


def test_cli_run_methods_override_is_validated(data_dir, mlflow_store, tmp_path, capsys):
    from workbench.cli import main

    f = tmp_path / "tiny.yaml"
    f.write_text("name: tiny_cli\ndataset:\n  name: ml-100k\nstages: [data]\n")
    assert main(["run", str(f), "--methods", "none", "bogus"]) != 0
    err = capsys.readouterr().err
    assert "methods.run" in err and "bogus" in err
    assert main(["run", str(f), "--methods", "soft_token"]) == 0


class _Terminated(KeyboardInterrupt):
    """Stands in for signals.Terminated: a KeyboardInterrupt subclass carrying its reason."""


@pytest.mark.parametrize("exc,said,status", [
    (RuntimeError("quantizer exploded\nmore detail"), "run FAILED (RuntimeError: quantizer exploded);", "FAILED"),
    (KeyboardInterrupt(), "run KILLED (SIGINT);", "KILLED"),
    (_Terminated("received SIGTERM"), "run KILLED (received SIGTERM);", "KILLED"),
])  # fmt: skip
def test_stopped_run_says_why(exc, said, status, data_dir, mlflow_store, monkeypatch, capsys):
    """The closing line says what MLflow records: KILLED with the signal for an interrupt, else FAILED and the error."""
    from workbench.study import pipeline

    def stop(ctx):
        raise exc

    monkeypatch.setitem(pipeline.STAGES, "data", stop)
    with pytest.raises(type(exc)):
        pipeline.run_experiment(_cfg(name="stopped"))
    assert said in capsys.readouterr().out
    parent = next(r for r in _runs("stopped") if "mlflow.parentRunId" not in r.data.tags)
    assert parent.info.status == status
