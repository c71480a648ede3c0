"""Cross-fitted ALS (`fit_als_folds`) and prefix fold-in (`fold_in_prefixes`) on a synthetic dataset.

Why synthetic: the properties under test (prefix sums equal the plain solve, no fold model saw its
own users, Procrustes puts fold factors in the reference space) need structure ALS can learn, not
MovieLens. 300 users x 200 items in 5 taste clusters with Zipf popularity inside each cluster;
each user's last item is held out to check that aligned fold vectors still rank it well.
"""

from __future__ import annotations

import numpy as np
import pytest

from workbench.sids.embeddings import (
    AlsFolds,
    AlsModel,
    fit_als,
    fit_als_folds,
    fold_in_prefixes,
    fold_in_users,
    unexplained_share,
    users_seen_by,
)

N_USERS, N_ITEMS, N_CLUSTERS = 300, 200, 5
ALS = dict(factors=8, iterations=15, regularization=0.05, alpha=1.0, seed=3)


def synthetic_sequences(seed: int = 0) -> list[np.ndarray]:
    """Per user 10..30 distinct items in random order, 85% of the mass on the user's cluster (Zipf inside it)."""
    rng = np.random.default_rng(seed)
    cluster_of_item = rng.permutation(N_ITEMS) % N_CLUSTERS  # [n_items]
    out = []
    for u in range(N_USERS):
        own = np.flatnonzero(cluster_of_item == u % N_CLUSTERS)  # [40]
        zipf = 1.0 / np.arange(1, len(own) + 1) ** 0.7
        p = np.full(N_ITEMS, 0.15 / (N_ITEMS - len(own)))  # [n_items]
        p[own] = 0.85 * zipf / zipf.sum()
        picked = rng.choice(N_ITEMS, size=int(rng.integers(10, 31)), replace=False, p=p)
        out.append(rng.permutation(picked))  # shuffled, so the held-out last item is any of them
    return out


@pytest.fixture(scope="module")
def data():
    seqs = synthetic_sequences()
    train = [s[:-1] for s in seqs]  # [n_users] each [len - 1]
    held_out = np.array([s[-1] for s in seqs])  # [n_users]
    reference = fit_als(train, N_ITEMS, show_progress=False, **ALS)
    folds = fit_als_folds(train, N_ITEMS, n_folds=3, reference=reference, **ALS)
    return train, held_out, reference, folds


def recall_at(k: int, vectors: np.ndarray, item_factors: np.ndarray, train, held_out) -> float:
    """Share of users whose held-out item is in the top k of vectors · item_factors (train items excluded)."""
    scores = vectors @ item_factors.T  # [n_users, n_items]
    for u, s in enumerate(train):
        scores[u, s] = -np.inf
    top = np.argpartition(-scores, k, axis=1)[:, :k]  # [n_users, k]
    return float((top == held_out[:, None]).any(axis=1).mean())


# ---- (a) fold_in_prefixes = fold_in_users on each prefix ---------------------------------------
@pytest.mark.parametrize("alpha", [1.0, 8.0])
def test_fold_in_prefixes_equals_fold_in_users(data, alpha):
    _, _, reference, _ = data
    model = AlsModel(reference.user_factors, reference.item_factors, reference.regularization, alpha)
    rng = np.random.default_rng(1)
    seq = rng.integers(0, N_ITEMS, size=120)  # ~30% repeats: each must count once, at its first occurrence
    seq[7] = seq[3]  # and one certain duplicate early on
    cuts = np.concatenate([[0, len(seq), 4, 8, 8], rng.integers(0, len(seq) + 1, size=30)])  # unsorted, repeated
    got = fold_in_prefixes(model, seq, cuts)  # [len(cuts), f]
    want = fold_in_users(model, [seq[:c] for c in cuts])
    assert got.shape == (len(cuts), model.factors) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    assert not got[0].any(), "cut 0 (no history) is the zero vector"
    # the duplicate at position 7 adds nothing: the prefixes of 7 and 8 items hold the same set
    np.testing.assert_allclose(fold_in_prefixes(model, seq, [7])[0], fold_in_prefixes(model, seq, [8])[0])


def test_fold_in_prefixes_rejects_bad_input(data):
    _, _, reference, _ = data
    with pytest.raises(ValueError, match="out of range"):
        fold_in_prefixes(reference, np.array([0, N_ITEMS]), np.array([1]))
    with pytest.raises(ValueError, match="cuts"):
        fold_in_prefixes(reference, np.array([0, 1]), np.array([3]))


# ---- (b) every user in one fold; no fold model saw its own users --------------------------------
def test_every_user_in_exactly_one_fold(data):
    train, _, _, folds = data
    assert folds.fold_of_user.shape == (N_USERS,)
    sizes = np.bincount(folds.fold_of_user, minlength=folds.n_folds)
    assert sizes.sum() == N_USERS and sizes.max() - sizes.min() <= 1
    assert all(folds.model_for(u) is folds.models[folds.fold_of(u)] for u in range(N_USERS))
    again = fit_als_folds(train, N_ITEMS, n_folds=3, reference=data[2], **ALS)
    np.testing.assert_array_equal(again.fold_of_user, folds.fold_of_user)  # deterministic for the seed


def test_fold_model_never_saw_its_users(data):
    train, _, reference, folds = data
    for k in range(folds.n_folds):
        own = np.flatnonzero(folds.fold_of_user == k)
        seen = users_seen_by(folds, k)
        assert not np.isin(own, seen).any(), f"fold {k} was fitted on some of its own users"
        np.testing.assert_array_equal(np.sort(np.concatenate([own, seen])), np.arange(N_USERS))
        assert not folds.models[k].user_factors[own].any(), "held-out users had interactions in the fit"
    # refit fold 0 deterministically from the other folds' users only: same factors after rotation
    k = 0
    seqs = [s if folds.fold_of(u) != k else np.zeros(0, np.int64) for u, s in enumerate(train)]
    raw = fit_als(seqs, N_ITEMS, show_progress=False, **{**ALS, "seed": int(folds.seeds[k])})
    fitted = np.zeros(N_ITEMS, bool)
    fitted[np.concatenate(seqs)] = True
    raw.item_factors[~fitted] = 0.0
    np.testing.assert_allclose(raw.item_factors @ folds.rotations[k], folds.models[k].item_factors, atol=1e-4)


def test_item_only_own_fold_touched_gives_that_fold_nothing(data):
    train, _, _, _ = data
    lonely, user = 0, 17  # keep item 0 in user 17's history only
    train = [s if u == user else s[s != lonely] for u, s in enumerate(train)]
    if lonely not in train[user]:
        train[user] = np.append(train[user], lonely)
    reference = fit_als(train, N_ITEMS, show_progress=False, **ALS)
    folds = fit_als_folds(train, N_ITEMS, n_folds=3, reference=reference, **ALS)
    k = folds.fold_of(user)
    assert folds.fitted_items[k] == N_ITEMS - 1 and not folds.model_for(user).item_factors[lonely].any()
    assert not folds.vectors_as_of(user, np.array([lonely]), np.array([1])).any()
    assert all(folds.models[j].item_factors[lonely].any() for j in range(folds.n_folds) if j != k)


# ---- (c) Procrustes alignment puts fold vectors in the reference space -------------------------
def test_alignment_brings_fold_factors_to_the_reference(data):
    _, _, reference, folds = data
    assert (folds.residuals < 0.5 * folds.unaligned_residuals).all(), (folds.residuals, folds.unaligned_residuals)
    for k, model in enumerate(folds.models):
        fitted = model.item_factors.any(axis=1)
        share = unexplained_share(model.item_factors[fitted], reference.item_factors[fitted])
        assert share == pytest.approx(folds.residuals[k], rel=1e-4)
    stats = folds.stats()
    assert stats["als_folds/alignment_residual_mean"] == pytest.approx(folds.residuals.mean())
    assert stats["als_folds/n_folds"] == 3


def test_aligned_fold_vectors_rank_held_out_items_in_reference_space(data):
    train, held_out, reference, folds = data
    vectors = np.stack([folds.vectors_as_of(u, s, [len(s)])[0] for u, s in enumerate(train)])  # [n_users, f]
    recall = recall_at(20, vectors, reference.item_factors, train, held_out)
    unseen = np.mean([N_ITEMS - len(s) for s in train])
    random = 20 / unseen
    assert recall > 3 * random, f"recall@20 {recall:.3f} vs random {random:.3f}"
    # honest, but not far from the reference's own (leaky) vectors
    leaky = recall_at(20, reference.user_factors, reference.item_factors, train, held_out)
    assert recall > 0.6 * leaky, (recall, leaky)


# ---- (d) save / load ---------------------------------------------------------------------------
def test_save_load_round_trip(data, tmp_path):
    train, _, _, folds = data
    folds.save(tmp_path / "folds")
    back = AlsFolds.load(tmp_path / "folds")
    arrays = ("fold_of_user", "trained_users", "rotations", "residuals", "unaligned_residuals", "fitted_items", "seeds")
    for name in arrays:
        np.testing.assert_array_equal(getattr(back, name), getattr(folds, name), err_msg=name)
    assert back.n_folds == folds.n_folds
    for a, b in zip(back.models, folds.models):
        np.testing.assert_array_equal(a.item_factors, b.item_factors)
        np.testing.assert_array_equal(a.user_factors, b.user_factors)
        assert (a.regularization, a.alpha) == (b.regularization, b.alpha)
    assert back.stats() == folds.stats()
    u, s = 5, train[5]
    np.testing.assert_array_equal(back.vectors_as_of(u, s, [0, 3, len(s)]), folds.vectors_as_of(u, s, [0, 3, len(s)]))


def test_a_fold_models_cached_gram_is_that_of_its_final_item_factors(data, monkeypatch):
    """`AlsModel.gram` (YᵀY + λI, cached at the first fold-in) must belong to the factors the model ends with.
    `_fit_without` zeroes the items no training user touched after `fit_als` has already folded in once; an
    in-place edit there would leave every later fold-in solving with those items' YᵀY. implicit 0.7 happens to
    leave untouched items at zero, so `fit_als` is wrapped to leave them at a random init, as the comment in
    `_fit_without` allows for. Item 0 is kept in one held-out user's history only."""
    from workbench.sids import embeddings

    real_fit = embeddings.fit_als

    def fit_keeping_init(seqs, n_items, **kw):
        m = real_fit(seqs, n_items, **kw)
        touched = np.zeros(n_items, bool)
        touched[np.concatenate([np.zeros(0, np.int64), *seqs])] = True
        m.item_factors[~touched] = np.random.default_rng(0).normal(size=(int((~touched).sum()), m.factors))
        return embeddings.AlsModel(m.user_factors, m.item_factors, m.regularization, m.alpha)

    monkeypatch.setattr(embeddings, "fit_als", lambda seqs, n, **kw: _folded(fit_keeping_init(seqs, n, **kw), seqs))
    train, _, _, _ = data
    lonely, user = 0, 17
    train = [s if u == user else s[s != lonely] for u, s in enumerate(train)]
    if lonely not in train[user]:
        train[user] = np.append(train[user], lonely)
    held_out = np.zeros(N_USERS, bool)
    held_out[user] = True
    raw, _, fitted = embeddings._fit_without(train, held_out, N_ITEMS, **ALS)
    assert not fitted[lonely] and not raw.item_factors[lonely].any()
    y = raw.item_factors.astype(np.float64)
    np.testing.assert_array_equal(raw.gram, y.T @ y + raw.regularization * np.eye(y.shape[1]))


def _folded(m: AlsModel, seqs) -> AlsModel:
    """As `fit_als` ends: user factors folded in against the item factors (which caches `gram`)."""
    m.user_factors = fold_in_users(m, seqs)
    return m
