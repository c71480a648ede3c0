"""User embeddings' as-of rule, and a study (the suite's tiny sizes, all five methods) on a dataset that only a
config names: a synthetic Amazon-2023 dump this test writes itself."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from workbench import names
from workbench.config import DatasetConfig
from workbench.data.readers import load_dataset
from workbench.data.user_embeddings import UserEmbeddings


def test_as_of_picks_the_latest_vector_strictly_before_the_prompt(data_dir, tmp_path):
    inter, items = tmp_path / "inter.csv", tmp_path / "items.csv"
    inter.write_text("user_id,item_id,timestamp\na,i1,100\na,i2,200\nb,i1,150\n")
    items.write_text("item_id,title\ni1,One\ni2,Two\n")
    emb = tmp_path / "emb.jsonl"
    rows = [("a", 50, [1, 0]), ("a", 150, [2, 0]), ("a", 200, [3, 0]), ("b", 300, [0, 9])]
    emb.write_text("".join(json.dumps({"user_id": u, "vector": v, "computed": t}) + "\n" for u, t, v in rows))
    cfg = DatasetConfig(name="t", interactions={"path": str(inter)}, items={"path": str(items)},
                        user_embeddings={"path": str(emb), "as_of": "computed"}, min_user_interactions=3)
    ds, report = load_dataset(cfg, say=lambda s: None)
    assert report["user_embeddings"]["mark"] == "as_of: the latest vector strictly before the prompt's last interaction"
    e = UserEmbeddings.from_table(ds.user_embeddings, ds.n_users)
    a, b = ds.users.set_index(names.RAW_USER)[names.USER][["a", "b"]]
    # a prompt whose last interaction is at 200 may use a's vector of 150, not the one computed at 200 itself;
    # at 150 only the one of 50; at 50 none (zeros); b's only vector is from after every prompt of b
    got = e.before(np.array([a, a, a, a, b]), np.array([200, 201, 150, 50, 150]))
    assert got.tolist() == [[2, 0], [3, 0], [1, 0], [0, 0], [0, 0]]
    plain = UserEmbeddings.from_table(ds.user_embeddings.drop_duplicates(names.USER).drop(columns=names.AS_OF), 2)
    assert plain.mark == "may include the test period"
    assert plain.before(np.array([a]), np.array([0])).tolist() == [[1, 0]]  # without as_of: the one vector


def write_amazon_2023(folder: Path, n_users: int = 60, n_items: int = 48, per_user: int = 12, seed: int = 0) -> dict:
    """`Beauty.jsonl.gz` + `meta_Beauty.jsonl.gz` in the 2023 layout, users each preferring one of four item groups,
    plus a user-embeddings file (the group as a one-hot vector, no as_of); returns the dataset section."""
    rng = np.random.default_rng(seed)
    reviews, t0 = [], 1_650_000_000_000
    for u in range(n_users):
        group = u % 4
        pool = [i for i in range(n_items) if i % 4 == group]
        for k, i in enumerate(rng.permutation(pool)[:per_user]):
            reviews.append({"rating": float(rng.integers(1, 6)), "title": "t", "text": "x", "images": [],
                            "asin": f"B{i:04d}", "parent_asin": f"B{i:04d}", "user_id": f"AE{u:05d}XYZ",
                            "timestamp": t0 + (u * 100 + k) * 3_600_000, "helpful_vote": 0, "verified_purchase": True})
    meta = [{"main_category": "All Beauty", "title": f"Group {i % 4} cream {i}", "average_rating": 4.5,
             "rating_number": 3, "features": [], "description": [], "price": None, "images": [], "videos": [],
             "store": f"Store {i % 4}", "categories": ["Beauty", f"Kind {i % 4}"], "details": {},
             "parent_asin": f"B{i:04d}", "bought_together": None} for i in range(n_items)]
    for name, rows in (("Beauty.jsonl.gz", reviews), ("meta_Beauty.jsonl.gz", meta)):
        (folder / name).write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    (folder / "user_vectors.jsonl").write_text("".join(
        json.dumps({"user_id": f"AE{u:05d}XYZ", "vector": np.eye(4)[u % 4].tolist()}) + "\n" for u in range(n_users)))
    return {"name": "beauty-synthetic", "format": "amazon-2023",
            "interactions": {"path": str(folder / "Beauty.jsonl.gz")},
            "items": {"path": str(folder / "meta_Beauty.jsonl.gz")},
            "user_embeddings": {"path": str(folder / "user_vectors.jsonl")}, "k_core": 5}


@pytest.mark.slow
def test_tiny_study_end_to_end_on_an_amazon_2023_dump(tmp_path, data_dir, mlflow_store, capsys, one_torch_thread):
    from mlflow.tracking import MlflowClient

    from workbench.config import deep_merge, load_study
    from workbench.paths import REPO_ROOT
    from workbench.study.outputs import run_experiment
    from workbench.testing import TINY_STUDY_OVERRIDES

    study = deep_merge(TINY_STUDY_OVERRIDES, {
        "base": str(REPO_ROOT / "experiments" / "quickstart.yaml"), "name": "amazon_study",
        "dataset": write_amazon_2023(tmp_path), "methods": {"run": list(names.METHODS)},
        "evaluation": {"signal_ablation": False}, "stages": list(names.STAGES)})
    path = tmp_path / "amazon_study.yaml"
    path.write_text(yaml.safe_dump(study))
    ctx = run_experiment(load_study(path), experiment_file=path)
    out = capsys.readouterr().out
    assert (ctx.dataset.n_users, ctx.dataset.n_items) == (60, 48)
    assert out.count("warning: dataset.user_embeddings has no as_of column") == 1
    table = ctx.products["evaluate"]
    assert set(names.METHODS) <= set(table["method"]), table
    parent = MlflowClient().get_run(ctx.parent.run_id)
    assert parent.data.tags[names.TAG_DATASET] == "beauty-synthetic"
    assert parent.data.tags[names.TAG_USER_EMBEDDINGS] == "may include the test period"
    # what the dataset supplied about users reaches the study's inputs, as the lookup that applies the as_of rule
    from workbench.study.outputs import inputs_from_context

    inp = inputs_from_context(ctx)
    assert inp.user_features is None  # the 2023 dump has no user file
    assert inp.user_embeddings.dim == 4 and inp.user_embeddings.mark == "may include the test period"
    raw = ctx.dataset.users[names.RAW_USER].tolist()
    u = raw.index("AE00006XYZ")  # user 6 prefers group 2
    assert inp.user_embeddings.before([u], [0]).tolist() == [[0, 0, 1, 0]]
