"""Notebook 01 executed end to end with papermill on ML-100K with small parameters; asserts on its recorded stats."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from workbench.paths import REPO_ROOT

NOTEBOOK = REPO_ROOT / "notebooks" / "01_data_and_semantic_ids.ipynb"


SMALL = {
    "embeddings": {"als_factors": 8},
    "semantic_ids": {"kind": "rq_kmeans", "also_fit": ["rq_vae"], "item_vectors": "text", "levels": 2,
                     "codebook_size": 16, "vae_epochs": 3},
    "user_sids": {"levels": 2, "codebook_size": 4},
}


def _run(tmp_path: Path, **parameters) -> tuple[dict, Path]:
    import papermill as pm

    stats_path = tmp_path / "stats.json"
    out = tmp_path / "01_out.ipynb"
    pm.execute_notebook(str(NOTEBOOK), str(out), kernel_name="python3", cwd=str(tmp_path), progress_bar=False,
                        parameters={"experiment": "experiments/quickstart.yaml", "overrides": SMALL,  # ml-100k
                                    "stats_path": str(stats_path), **parameters})
    return json.loads(Path(stats_path).read_text()), out


@pytest.mark.notebook
@pytest.mark.timeout(900)
def test_notebook_01_on_a_dataset_file(tmp_path, data_dir, mlflow_store):
    """`dataset_file`: your own data through the notebook; here MovieLens-100K as the RecBole files the wheel ships
    (a dataset named only by its files), with absolute paths since the kernel runs in a temporary folder."""
    import importlib.util

    import yaml

    folder = Path(importlib.util.find_spec("recbole").origin).parent / "dataset_example" / "ml-100k"
    spec = {"name": "ml-100k-files", "format": "recbole", "interactions": {"path": str(folder / "ml-100k.inter")},
            "items": {"path": str(folder / "ml-100k.item"), "title": "movie_title", "year": "release_year",
                      "text": ["class"]}, "users": {"path": str(folder / "ml-100k.user")}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"dataset": spec}))
    res, _ = _run(tmp_path, dataset_file=str(tmp_path / "mine.yaml"), track=False)
    assert (res["n_users"], res["n_items"]) == (943, 1682)
    assert res["data"]["data/n_interactions"] == 100_000
    assert res["dataset"] == "ml-100k-files"


@pytest.mark.notebook
@pytest.mark.timeout(900)
def test_notebook_01_runs(tmp_path, data_dir, mlflow_store):
    res, out = _run(tmp_path)
    assert (res["n_users"], res["n_items"]) == (943, 1682)
    assert res["data"]["data/n_interactions"] == 100_000
    assert set(res["items"]) == {"rq_kmeans", "rq_vae"}
    km = res["items"]["rq_kmeans"]
    assert 0.5 <= km["utilization_l0"] <= 1.0 and 0.5 <= km["utilization_l1"] <= 1.0
    assert 0.0 < km["collision_rate"] < 1.0  # 256 cells for 1,682 items: many collide, not all
    assert km["max_prefix_group"] >= 2 and res["dedup_size"] >= km["max_prefix_group"]
    assert 0.0 < km["quantization_error"] < 1.0
    assert res["sids_unique"]
    assert res["shared_prefix_rows"] > 0
    assert res["genre_coherence"]["rq_kmeans"] > 0.05, "text SIDs should group movies of similar genres"
    assert 0.0 <= res["user_shared_share"] <= 1.0
    # the figures were rendered in the executed notebook
    nb = nbformat.read(out, as_version=4)
    mimes = {k for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) for k in o.get("data", {})}
    assert "application/vnd.plotly.v1+json" in mimes or "text/html" in mimes
