"""EASE baseline: the closed form, the ranking, better than popularity where items have structure, lambda picked on
validation, the test protocol (B on train, history train + valid), and the config/cache-key rules around it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from workbench import names
from workbench.study.ease import ease_rank, ease_tune, ease_weights, gram
from workbench.study.evaluate import per_user_metrics, ranks_of


def _structured(n_users=300, n_clusters=12, per_cluster=12, seed=0):
    """Users who each stay inside one cluster of items; clusters differ in size of audience so popularity is skewed
    across clusters. Train: 6 items of the user's cluster; valid and test: two more of the same cluster."""
    rng = np.random.default_rng(seed)
    weights = np.linspace(3.0, 1.0, n_clusters)
    cluster = rng.choice(n_clusters, size=n_users, p=weights / weights.sum())
    train, valid, test = [], np.empty(n_users, np.int64), np.empty(n_users, np.int64)
    for u, c in enumerate(cluster):
        items = rng.permutation(per_cluster)[:8] + c * per_cluster
        train.append(items[:6].astype(np.int64))
        valid[u], test[u] = items[6], items[7]
    return train, valid, test, n_clusters * per_cluster


def _ndcg10(lists, targets) -> float:
    return float(per_user_metrics(ranks_of(lists, targets), (10,))[names.ndcg_at(10)].mean())


def test_weights_are_the_closed_form():
    rng = np.random.default_rng(0)
    train = [rng.choice(15, size=rng.integers(1, 8), replace=False) for _ in range(40)]
    train[0] = np.array([3, 3, 4])  # a repeated item counts once (binary X)
    x = np.zeros((40, 15))
    for u, s in enumerate(train):
        x[u, s] = 1.0
    assert np.allclose(gram(train, 15), x.T @ x)
    for lam in (0.5, 20.0):
        p = np.linalg.inv(x.T @ x + lam * np.eye(15))
        want = np.eye(15) - p @ np.diag(1.0 / np.diag(p))
        b = ease_weights(gram(train, 15), lam)
        assert b.dtype == np.float64 and np.allclose(b, want, atol=1e-12)
        assert np.all(np.diag(b) == 0.0)
    with pytest.raises(ValueError, match="lambda must be > 0"):
        ease_weights(gram(train, 15), 0.0)


def test_rank_orders_by_score_bans_seen_and_ignores_chunking():
    rng = np.random.default_rng(1)
    train = [rng.choice(30, size=rng.integers(1, 10), replace=False) for _ in range(60)]
    b = ease_weights(gram(train, 30), 5.0)
    seen = [np.r_[s, rng.integers(0, 30, size=2)] for s in train]
    got = ease_rank(b, train, seen, 10)
    for u, (hist, lst) in enumerate(zip(train, got)):
        score = np.zeros(30)
        score[np.unique(hist)] = 1.0
        score = score @ b
        want = sorted((j for j in range(30) if j not in set(seen[u].tolist())), key=lambda j: (-score[j], j))[:10]
        assert lst.tolist() == want
    for chunk in (1, 7):
        assert all(np.array_equal(a, c) for a, c in zip(ease_rank(b, train, seen, 10, chunk=chunk), got))


def test_beats_popularity_where_items_have_structure():
    from workbench.study.baselines import popularity_rank

    train, valid, test, n_items = _structured()
    res = ease_tune(train, valid, n_items, (1.0, 10.0, 100.0))
    hist = [np.r_[t, v] for t, v in zip(train, valid)]
    ease = _ndcg10(ease_rank(res.weights, hist, hist, 10), test)
    pop = _ndcg10(popularity_rank(train, n_items, hist, 10), test)
    assert ease > 0.3 and ease > 2 * pop, (ease, pop)


def test_lambda_is_picked_on_validation():
    train, valid, test, n_items = _structured(n_users=200, seed=3)
    rng = np.random.default_rng(4)
    train = [np.r_[t, rng.integers(0, n_items, size=4)] for t in train]  # noise: lambda matters
    grid = (0.3, 30.0, 3000.0, 3e5)
    res = ease_tune(train, valid, n_items, grid)
    want = {lam: _ndcg10(ease_rank(ease_weights(gram(train, n_items), lam), train, train, 10), valid) for lam in grid}
    assert res.per_lambda == pytest.approx(want, abs=1e-12)  # scored on the valid items, train banned
    assert len(set(np.round(list(want.values()), 6))) > 1  # the grid's lambdas do differ here
    assert res.lam == max(grid, key=lambda lam: want[lam]) and res.valid_ndcg10 == pytest.approx(want[res.lam])
    assert np.allclose(res.weights, ease_weights(gram(train, n_items), res.lam))
    assert res.fit_s > 0 and res.wall_s >= res.fit_s
    with pytest.raises(ValueError, match="ease_lambda_grid is empty"):
        ease_tune(train, valid, n_items, ())


def test_test_lists_use_train_weights_and_train_plus_valid_history():
    from workbench.study.prompts import Interactions
    from workbench.study.stages.evaluate import ease_test_lists

    train, valid, test, n_items = _structured(n_users=120, seed=5)
    inp = SimpleNamespace(interactions=Interactions(train, valid, test, n_items))
    cfg = SimpleNamespace(evaluation=SimpleNamespace(ease_lambda_grid=(1.0, 50.0)))
    users = np.arange(0, 120, 2)
    seen = [np.r_[train[u], valid[u]] for u in users]
    lists, info = ease_test_lists(cfg, inp, users, seen, 10)
    res = ease_tune(train, valid, n_items, (1.0, 50.0))
    assert info["ease/lambda"] == res.lam and info[names.BEST_VALID_NDCG10] == res.valid_ndcg10
    want = ease_rank(res.weights, seen, seen, 10)  # B fitted on train only; scored with train + valid
    assert [a.tolist() for a in lists] == [w.tolist() for w in want]
    assert not any(np.isin(a, s).any() for a, s in zip(lists, seen))


def test_config_grid_is_checked_and_not_in_the_eval_cache_key():
    from workbench.config import load_config
    from workbench.paths import REPO_ROOT
    from workbench.study.model_evals import key as eval_key

    cfg = load_config(REPO_ROOT / "experiments" / "quickstart.yaml")
    assert cfg.evaluation.ease_lambda_grid == (50.0, 200.0, 500.0, 1000.0, 3000.0)
    users = np.arange(5)
    key = eval_key(cfg, REPO_ROOT, users, None)
    other = cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(update={"ease_lambda_grid": (7.0,)})})
    assert eval_key(other, REPO_ROOT, users, None) == key  # a baseline's grid does not re-run the models
    beam = cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(update={"beam_width": 31})})
    assert eval_key(beam, REPO_ROOT, users, None) != key
    for bad in ([], [100.0, -1.0]):
        with pytest.raises(ValueError, match="ease_lambda_grid must be a non-empty list of lambdas > 0"):
            type(cfg.evaluation).model_validate({"ease_lambda_grid": bad})
