"""Bad dataset files get one clear message (the exact text is part of the contract) and leave nothing in data/."""

from __future__ import annotations

import pytest

from workbench.config import DatasetConfig, parse_config
from workbench.data.check import prepare
from workbench.data.files import DataError
from workbench.data.readers import load_dataset

INTER = "user_id,item_id,timestamp\nu1,i1,1\nu1,i2,2\nu1,i3,3\n"
ITEMS = "item_id,title\ni1,One\ni2,Two\ni3,Three\n"


def _write(folder, name, text):
    p = folder / name
    p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
    return str(p)


def _error(data_dir, tmp_path, inter=INTER, items=ITEMS, inter_name="inter.csv", items_name="items.csv",
           **section) -> str:
    cfg = DatasetConfig(name="t", interactions={"path": _write(tmp_path, inter_name, inter), **section.pop("i", {})},
                        items={"path": _write(tmp_path, items_name, items), **section.pop("it", {})}, **section)
    with pytest.raises(DataError) as e:
        load_dataset(cfg, say=lambda s: None)
    cache = data_dir / "cache" / "dataset"
    assert not cache.exists() or not any(cache.iterdir()), "a failed read left a cache entry behind"
    return str(e.value)


def test_missing_column_names_file_column_found_and_key(data_dir, tmp_path):
    msg = _error(data_dir, tmp_path, inter="uid,item_id,timestamp\nu1,i1,1\n")
    assert msg == (f"{tmp_path}/inter.csv: the interactions file has no column 'user_id' (columns found: uid, item_id, "
                   "timestamp); map it with dataset.interactions.user")
    msg = _error(data_dir, tmp_path, it={"text": ["brand"]})
    assert msg == (f"{tmp_path}/items.csv: the items file has no column 'brand' (columns found: item_id, title); "
                   "map it with dataset.items.text")


def test_unparseable_timestamp_names_row_and_value(data_dir, tmp_path):
    msg = _error(data_dir, tmp_path, inter="user_id,item_id,timestamp\nu1,i1,1\nu1,i2,yesterday\n")
    assert msg == (f"{tmp_path}/inter.csv: row 2: timestamp 'yesterday' is not a number, while other rows hold epoch "
                   "times (column 'timestamp', dataset.interactions.timestamp; set dataset.interactions.timestamp_unit "
                   "to s, ms or iso if the guess is wrong)")
    msg = _error(data_dir, tmp_path, inter="user_id,item_id,timestamp\nu1,i1,2024-01-02\nu1,i2,2024-13-45\n")
    assert msg == (f"{tmp_path}/inter.csv: row 2: timestamp '2024-13-45' is not an ISO 8601 time (column 'timestamp', "
                   "dataset.interactions.timestamp; set dataset.interactions.timestamp_unit to s, ms or iso if the "
                   "guess is wrong)")


def test_empty_file_and_header_only(data_dir, tmp_path):
    assert _error(data_dir, tmp_path, inter="") == (f"{tmp_path}/inter.csv is empty (0 bytes); "
                                                    "dataset.interactions.path must name a file with a header and rows")
    assert _error(data_dir, tmp_path, inter="user_id,item_id,timestamp\n") == (
        f"{tmp_path}/inter.csv: the interactions file has a header but no rows")


def test_file_not_in_declared_format(data_dir, tmp_path):
    assert _error(data_dir, tmp_path, inter_name="inter.parquet") == (
        f"{tmp_path}/inter.parquet is not a parquet file (it starts like text); set dataset.interactions.format to "
        "what it is (csv, tsv, jsonl)")
    assert _error(data_dir, tmp_path, inter='{"user_id": "u1"}\n') == (
        f"{tmp_path}/inter.csv looks like JSON Lines, not CSV; set dataset.interactions.format: jsonl")
    assert _error(data_dir, tmp_path, inter='{"user_id": "u1", "item_id": "i1", "timestamp": 1}\nuser_id,item_id\n',
                  inter_name="inter.jsonl") == (
        f"{tmp_path}/inter.jsonl: line 2 is not a JSON object (JSONDecodeError: Expecting value: line 1 column 1 "
        "(char 0)); is the file JSON Lines, one record per line?")
    assert _error(data_dir, tmp_path, items_name="items.txt") == (
        f"{tmp_path}/items.txt: cannot tell the format from the name; set dataset.items.format to one of parquet, "
        "csv, tsv, jsonl")


def test_items_absent_from_items_file_fail_or_drop(data_dir, tmp_path):
    inter = INTER + "u2,i9,4\nu2,i8,5\nu3,i9,6\n"
    assert _error(data_dir, tmp_path, inter=inter) == (
        f"{tmp_path}/inter.csv: 3 interactions name 2 items that {tmp_path}/items.csv does not list (first: 'i9', "
        "'i8'); add them to the items file, or set dataset.missing_items: drop to drop those interactions")
    cfg = DatasetConfig(name="t", interactions={"path": _write(tmp_path, "inter.csv", inter)},
                        items={"path": _write(tmp_path, "items.csv", ITEMS)}, missing_items="drop")
    ds, report = load_dataset(cfg, say=lambda s: None)
    assert report["missing_items"] == {"interactions": 3, "items": 2, "action": "drop"}
    assert len(ds.interactions) == 3 and ds.users["raw_user_id"].tolist() == ["u1"]


def test_duplicate_rows_are_dropped_and_counted(data_dir, tmp_path):
    cfg = DatasetConfig(name="t", interactions={"path": _write(tmp_path, "inter.csv", INTER + "u1,i2,2\nu1,i2,9\n")},
                        items={"path": _write(tmp_path, "items.csv", ITEMS)})
    ds, report = load_dataset(cfg, say=lambda s: None)
    assert report["duplicates_dropped"] == 1 and len(ds.interactions) == 4  # (u1, i2, 9) is a second interaction


def test_non_utf8_text_names_the_line(data_dir, tmp_path):
    assert _error(data_dir, tmp_path, items="item_id,title\ni1,One\ni2,Caf\xe9\n".encode("latin-1")) == (
        f"{tmp_path}/items.csv: line 3 is not UTF-8 text (byte 0xe9 at column 7); re-save the file as UTF-8")


def _study(tmp_path, items: str, **dataset):
    return parse_config({"name": "t", "dataset": {
        "name": "t", "interactions": {"path": _write(tmp_path, "inter.csv", INTER)},
        "items": {"path": _write(tmp_path, "items.csv", items), "text": ["brand"]}, "min_user_interactions": 3,
        **dataset}, "semantic_ids": {"item_vectors": "collab"}, "methods": {"run": ["none", "text_history"]}})


def test_items_without_text_refused_when_read_or_fall_back(data_dir, tmp_path):
    items = "item_id,title,brand\ni1,One,\ni2,,\ni3,,Acme\n"
    with pytest.raises(DataError) as e:
        prepare(_study(tmp_path, items), say=lambda s: None)
    assert str(e.value) == ("1 items have no text (first: 'i2'), and methods.run: text_history reads item text; give "
                            "them a title or text column (dataset.items.title / dataset.items.text), or set "
                            "dataset.items_without_text: fallback (their text is then their raw id)")
    prep, note = prepare(_study(tmp_path, items, items_without_text="fallback"), say=lambda s: None)
    assert note == ("1 items have no text (first: 'i2'): their text is their raw id "
                    "(dataset.items_without_text: fallback)")
    assert prep.dataset.items["title"].tolist() == ["One", "i2", ""] and prep.dataset.items["genres"][2] == "Acme"


def _embeddings(data_dir, tmp_path, text: str, name="emb.jsonl", **section):
    cfg = DatasetConfig(name="t", interactions={"path": _write(tmp_path, "inter.csv", INTER + "u2,i1,5\n")},
                        items={"path": _write(tmp_path, "items.csv", ITEMS)},
                        user_embeddings={"path": _write(tmp_path, name, text), **section})
    return load_dataset(cfg, say=lambda s: None)


def test_user_embeddings_mixed_dimension_non_finite_and_missing_users(data_dir, tmp_path):
    with pytest.raises(DataError) as e:
        _embeddings(data_dir, tmp_path, '{"user_id": "u1", "vector": [1, 2]}\n{"user_id": "u2", "vector": [1]}\n'
                                        '{"user_id": "u3", "vector": [3, 4]}\n')
    assert str(e.value) == (f"{tmp_path}/emb.jsonl: user embeddings of mixed dimension (2 in 2 rows, 1 in 1 rows; "
                            "first odd one: row 2, user 'u2'); every vector must have the same length")
    with pytest.raises(DataError) as e:
        _embeddings(data_dir, tmp_path, "user_id,vector\nu1,1 2\nu2,nan 1\n", name="emb.csv")
    assert str(e.value) == (f"{tmp_path}/emb.csv: 1 user embeddings hold NaN or infinite values (first: row 2, user "
                            "'u2'); fix or leave out those rows")
    ds, report = _embeddings(data_dir, tmp_path, "user_id,vector\nu1,\"[0.5, 1.5]\"\nu9,1 1\n", name="emb.csv")
    emb = report["user_embeddings"]
    assert (emb["users_with"], emb["users_without"], emb["unknown_users_dropped"], emb["default"]) == (
        1, 1, 1, "zero vector")
    assert emb["mark"] == "may include the test period"
    assert ds.user_embeddings["vector"][0].tolist() == [0.5, 1.5]
