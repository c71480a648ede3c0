"""The user-signal sources (`study/user_signal.py`): what each one reads, no supervised target in any vector, the
same kind of model for training and test vectors, and the train keys of the methods without a signal.

Synthetic data: 24 users x 30 items with distinct increasing timestamps, small enough that every window and prompt
is checked; the sources are the real ones (ALS folds, SASRec folds, the embeddings' as_of lookup, the features'
encoding), only their data is made up.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from workbench.sids.layout import SidLayout, add_dedup_digit
from workbench.study.prompts import Interactions, PromptBuilder, UserEncoder, eval_examples, signal_cut
from workbench.study.windows import WindowBuilder

N_USERS, N_ITEMS = 24, 30


def _codes():
    rng = np.random.default_rng(0)
    return add_dedup_digit(np.stack([rng.integers(0, 4, N_ITEMS), rng.integers(0, 4, N_ITEMS)], 1))


CODES = _codes()
LAYOUT = SidLayout(base_vocab_size=100, item_codebooks=(4, 4), dedup_size=int(CODES[:, -1].max()) + 1,
                   user_codebooks=(3,))
SIDS = LAYOUT.item_codes_to_ids(CODES)


def _builder(method="soft_token", k=3, m=6):
    return PromptBuilder(method, LAYOUT, SIDS, recent_k=k, long_m=m, max_prompt_tokens=512)


def _data() -> Interactions:
    """Per user 6..16 distinct items; user u's j-th interaction at time 1000 * j + u (valid and test after train)."""
    rng = np.random.default_rng(7)
    seqs = [rng.permutation(N_ITEMS)[: int(rng.integers(6, 17))].astype(np.int64) for _ in range(N_USERS)]
    times = [1000 * np.arange(len(s), dtype=np.int64) + u for u, s in enumerate(seqs)]
    return Interactions([s[:-2] for s in seqs], np.array([s[-2] for s in seqs]), np.array([s[-1] for s in seqs]),
                        N_ITEMS, [t[:-2] for t in times], np.array([t[-2] for t in times]),
                        np.array([t[-1] for t in times]))


def _encoder(source, history="older", codes=None):
    return UserEncoder(source.vectors, source.dim, codes, source.train_vectors, history)


def _windows(enc, data, method="soft_token", seed=0):
    return WindowBuilder(_builder(method), max_tokens=512).epoch(data.train, enc, np.random.default_rng(seed))


def _cut(w, history):
    return w.start if history == "older" else w.start + 1


# ---- als --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def als():
    from workbench.sids.embeddings import fit_als, fit_als_folds

    data = _data()
    ref = fit_als(data.train, N_ITEMS, factors=4, iterations=3, seed=0, show_progress=False)
    return data, ref, fit_als_folds(data.train, N_ITEMS, 3, 4, 3, 0.05, 1.0, 0, reference=ref)


@pytest.mark.parametrize("history", ["older", "all"])
def test_als_test_vectors_come_from_the_fold_model_that_trained_the_windows(als, history):
    """`als_test_vectors: folds`: a test prompt's vector of user u is the fold-in against the fold model that never
    saw u, the very function its training windows are folded in with; `full` is the full-train ALS (which saw u)."""
    from workbench.sids.embeddings import fold_in_users, users_seen_by
    from workbench.study.user_signal import AlsSource

    data, ref, folds = als
    enc = _encoder(AlsSource(ref, folds, "folds"), history)
    ps = eval_examples(_builder(), data, "test", enc)
    for i, u in enumerate(ps.users):
        hist = ps.seen[i]
        c = signal_cut(len(hist), 3, history)
        assert u not in set(users_seen_by(folds, folds.fold_of(u)).tolist())
        np.testing.assert_allclose(ps.user_vectors[i], folds.vectors_as_of(u, hist, np.array([c]))[0], atol=1e-5)
        assert data.test[u] not in set(hist[:c].tolist())
    full = eval_examples(_builder(), data, "test", _encoder(AlsSource(ref, folds, "full"), history))
    hists = [h[: signal_cut(len(h), 3, history)] for h in full.seen]
    np.testing.assert_allclose(full.user_vectors, fold_in_users(ref, hists), atol=1e-6)
    assert not np.allclose(full.user_vectors, ps.user_vectors, atol=1e-3)  # another model: the mismatch it fixes
    for w in _windows(enc, data).windows:  # and the windows: the same fold model, no target folded in
        np.testing.assert_allclose(w.user_vector, folds.vectors_as_of(w.user, data.train[w.user],
                                                                      np.array([_cut(w, history)]))[0])
        assert not set(data.train[w.user][: _cut(w, history)].tolist()) & set(w.targets.tolist())


# ---- features -------------------------------------------------------------------------------------
def _features():
    return pd.DataFrame({"user": np.arange(8), "age": [20.0, 30.0, np.nan, 40.0, 20.0, 30.0, 50.0, 30.0],
                         "job": ["a", "b", "a", None, "c", "a", "b", "d"]})


def test_feature_encoding_one_hot_with_other_and_unknown_and_standardized_numbers():
    from workbench.study.user_signal import FeatureEncoding, FeatureSource

    enc = FeatureEncoding.fit(_features(), max_categories=2)
    assert enc.column_names == ["age", "age=unknown", "job=a", "job=b", "job=other", "job=unknown"]
    x = enc.transform(_features())
    ages = np.array([20.0, 30.0, 40.0, 20.0, 30.0, 50.0, 30.0])
    known = [0, 1, 3, 4, 5, 6, 7]
    np.testing.assert_allclose(x[known, 0], (ages - ages.mean()) / ages.std(), rtol=1e-5)  # over the train users
    assert x[2, 0] == 0 and x[2, 1] == 1 and x[known, 1].sum() == 0
    np.testing.assert_array_equal(x[:, 2:].argmax(1), [0, 1, 0, 3, 2, 0, 1, 2])  # c, d: other; None: unknown
    assert (x[:, 2:].sum(1) == 1).all()  # one-hot: a linear projection of it is an embedding lookup
    # static: every window and prompt of a user reads the same vector, whatever the interactions
    src = FeatureSource(x, enc)
    np.testing.assert_array_equal(src.train_vectors(3, np.arange(9), np.array([0, 4, 9])), np.repeat(x[3:4], 3, 0))
    np.testing.assert_array_equal(src.vectors([3, 5], [[1, 2], []], np.array([-1, 7])), x[[3, 5]])


def test_features_source_reads_no_interaction():
    """No interaction reaches a features vector: the same windows and prompts over scrambled histories give the
    same vectors (the static features of each user)."""
    from workbench.study.user_signal import FeatureEncoding, FeatureSource

    data = _data()
    table = pd.DataFrame({"user": np.arange(N_USERS), "g": [str(u % 3) for u in range(N_USERS)],
                          "n": np.arange(N_USERS, dtype=float)})
    enc = FeatureEncoding.fit(table, 4)
    src = FeatureSource(enc.transform(table), enc)
    rng = np.random.default_rng(1)
    other = Interactions([rng.permutation(N_ITEMS)[: len(s)] for s in data.train], data.valid, data.test, N_ITEMS)
    for history in ("older", "all"):
        for a, b in zip(_windows(_encoder(src, history), data).windows,
                        _windows(_encoder(src, history), other).windows):
            np.testing.assert_array_equal(a.user_vector, src.matrix[a.user])
            np.testing.assert_array_equal(a.user_vector, b.user_vector)
        ps = eval_examples(_builder(), other, "test", _encoder(src, history))
        np.testing.assert_array_equal(ps.user_vectors, src.matrix[ps.users])


# ---- embeddings -----------------------------------------------------------------------------------
def _embedding_table(data: Interactions):
    """User u's vectors at as_of = each interaction's time + 1: the multi-hot of every item up to and including
    that interaction (what a vector computed then could know). Ignoring as_of would hand a prompt its target."""
    from workbench.data.user_embeddings import UserEmbeddings

    rows = []
    for u in range(N_USERS):
        items = np.r_[data.train[u], data.valid[u], data.test[u]]
        times = np.r_[data.train_times[u], data.valid_times[u], data.test_times[u]]
        for j in range(len(items)):
            v = np.zeros(N_ITEMS, np.float32)
            v[items[: j + 1]] = 1.0
            rows.append({"user": u, "vector": v, "as_of": int(times[j]) + 1})
    return UserEmbeddings.from_table(pd.DataFrame(rows), N_USERS)


@pytest.mark.parametrize("history", ["older", "all"])
def test_embeddings_as_of_keeps_every_target_out_of_its_vector(history):
    from workbench.study.user_signal import EmbeddingSource

    data = _data()
    src = EmbeddingSource(_embedding_table(data), data.train_times)
    enc = _encoder(src, history)
    ws = _windows(enc, data)
    for w in ws.windows:
        read = set(np.flatnonzero(w.user_vector).tolist())
        assert not read & set(w.targets.tolist()), "a window's target is in its user vector"
        assert read <= set(data.train[w.user][: _cut(w, history)].tolist())  # only what came before the cut
    for split, target in (("valid", data.valid), ("test", data.test)):
        ps = eval_examples(_builder(), data, split, enc)
        for i, u in enumerate(ps.users):
            read = set(np.flatnonzero(ps.user_vectors[i]).tolist())
            assert target[u] not in read
            assert read <= set(ps.seen[i][: signal_cut(len(ps.seen[i]), 3, history)].tolist())
    if history == "all":  # the latest vector strictly before the prompt's last interaction: all but that one
        ps = eval_examples(_builder(), data, "test", enc)
        assert set(np.flatnonzero(ps.user_vectors[0]).tolist()) == set(ps.seen[0][:-1].tolist())


def _ctx(cfg, **dataset):
    base = {"name": "toy", "user_features": None, "user_embeddings": None, "n_users": N_USERS, "n_items": N_ITEMS}
    return SimpleNamespace(cfg=cfg, dataset=SimpleNamespace(**{**base, **dataset}), split=None,
                           keys={"data": "d", "embeddings": "e"})


@pytest.mark.parametrize("source,what", [("features", "user features"), ("embeddings", "user-embedding table")])
def test_a_source_the_dataset_cannot_feed_says_so(source, what):
    from workbench.config import parse_config
    from workbench.study.user_signal import SignalSourceError, build_user_signal

    cfg = parse_config({"name": "x", "dataset": {"name": "ml-100k"}, "user_signal": {"source": source}})
    with pytest.raises(SignalSourceError, match=f"{source} needs .*{what}.*dataset 'toy' has none"):
        build_user_signal(_ctx(cfg))


# ---- sasrec ---------------------------------------------------------------------------------------
def _sasrec_settings():
    from workbench.study.baselines import SasrecSettings

    return SasrecSettings(max_len=5, hidden=8, layers=1, heads=1, epochs=2, patience=2, batch_size=16, progress=False)


@pytest.fixture(scope="module")
def sasrec(tmp_path_factory, one_torch_thread):
    from workbench.study.user_signal import fit_sasrec_folds

    data = _data()
    folder = tmp_path_factory.mktemp("sasrec_folds")
    lines = []
    folds = fit_sasrec_folds(data.train, data.valid, N_ITEMS, 3, _sasrec_settings(), 0, folder, lines.append)
    return data, folds, folder, lines


@pytest.mark.parametrize("history", ["older", "all"])
def test_sasrec_vectors_come_from_the_fold_model_that_never_saw_the_user(sasrec, history):
    """Every vector of user u, training windows and test prompts alike: the user state of the fold model that was
    trained (and early-stopped) without u, over the interactions before the cut only."""
    from workbench.study.baselines import sasrec_states

    data, folds, _, _ = sasrec
    enc = _encoder(folds, history)
    for w in _windows(enc, data).windows:
        k = int(folds.fold_of_user[w.user])
        assert not folds.trained_users[k, w.user], "a fold model saw the user it computes vectors for"
        prefix = data.train[w.user][: _cut(w, history)]
        assert not set(prefix.tolist()) & set(w.targets.tolist())
        want = sasrec_states(folds.models[k], [prefix], 5)[0] if len(prefix) else np.zeros(8)
        np.testing.assert_allclose(w.user_vector, want, atol=1e-5)
    ps = eval_examples(_builder(), data, "test", enc)
    for i, u in enumerate(ps.users):
        assert not folds.trained_users[folds.fold_of_user[u], u]
        hist = ps.seen[i][: signal_cut(len(ps.seen[i]), 3, history)]
        assert data.test[u] not in set(hist.tolist())
        np.testing.assert_allclose(ps.user_vectors[i], sasrec_states(folds.model_for(u), [hist], 5)[0], atol=1e-5)
    assert folds.trained_users.sum(0).tolist() == [2] * N_USERS  # each user trained the two other folds' models


def test_sasrec_folds_are_stored_per_fold_and_reused(sasrec):
    from workbench.study.user_signal import fit_sasrec_folds

    data, folds, folder, lines = sasrec
    assert sum("epoch" in line for line in lines) >= 3 and sorted(p.name for p in folder.iterdir()) == [
        "fold_0.pt", "fold_1.pt", "fold_2.pt"]  # progress lines while training; no resume file left
    again_lines = []
    again = fit_sasrec_folds(data.train, data.valid, N_ITEMS, 3, _sasrec_settings(), 0, folder, again_lines.append)
    assert all("stored, reused" in line for line in again_lines) and len(again_lines) == 3
    np.testing.assert_allclose(again.train_vectors(5, data.train[5], np.array([2, 4])),
                               folds.train_vectors(5, data.train[5], np.array([2, 4])))


# ---- cache keys -----------------------------------------------------------------------------------
def test_only_the_methods_that_read_a_signal_get_a_new_train_key_with_the_source():
    from workbench.config import parse_config
    from workbench.study.inputs import StudyInputs, train_key
    from workbench.study.user_signal import signal_key

    def inputs(signal):
        cfg = parse_config({"name": "x", "dataset": {"name": "ml-100k"}, "user_signal": signal})
        return cfg, StudyInputs(None, [], None, np.zeros((1, 1)), (), 0, (), "v", "upstream",
                                signal_key=signal_key(cfg, "source-model"))

    variants = [inputs(s) for s in ({"source": "als"}, {"source": "als", "als_test_vectors": "full"},
                                    {"source": "features"}, {"source": "sasrec"}, {"source": "als", "history": "all"})]
    for method in ("none", "none_long", "text_history"):
        assert len({train_key(cfg, inp, method, 1e-3, 0) for cfg, inp in variants}) == 1, method
    for method in ("soft_token", "user_sid"):
        assert len({train_key(cfg, inp, method, 1e-3, 0) for cfg, inp in variants}) == len(variants), method


# ---- through the real pipeline --------------------------------------------------------------------
@pytest.mark.slow
def test_a_tiny_study_on_the_features_source_ablates_it_and_shares_none_with_als(tmp_path, data_dir, mlflow_store,
                                                                                  one_torch_thread):
    """ML-100K at tiny size with `user_signal.source: features`: soft_token reads the 1-hot/standardized features
    (its vectors are theirs), its own / shuffled / zeroed rows are in the table, and the `als` source's study finds
    the same `none` model already trained (its key does not carry the source) but not soft_token's."""
    import importlib.util

    import yaml

    if importlib.util.find_spec("recbole") is None:
        pytest.skip("MovieLens-100K ships in the recbole wheel: pip install --no-deps recbole==1.2.1")
    from workbench.config import deep_merge, load_study
    from workbench.paths import REPO_ROOT
    from workbench.study.inputs import method_test_prompts, test_users, train_entry
    from workbench.study.outputs import inputs_from_context, prepare_context, run_experiment
    from workbench.testing import TINY_STUDY_OVERRIDES

    def study(source):
        cfg = deep_merge(TINY_STUDY_OVERRIDES, {"base": str(REPO_ROOT / "experiments" / "quickstart.yaml"),
                                                "name": f"tiny_{source}", "user_signal": {"source": source}})
        path = tmp_path / f"tiny_{source}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return load_study(path), path

    cfg, path = study("features")
    ctx = run_experiment(cfg, experiment_file=path)
    table = ctx.products["evaluate"].set_index("method")
    assert {"none", "soft_token", "soft_token/shuffled", "soft_token/zeroed"} <= set(table.index)
    inp = inputs_from_context(ctx)
    assert inp.encoder.dim == ctx.user_signal.dim == 63  # ML-100K: age (2) + gender (4) + occupation (23) + zip (34)
    (res,) = [r for (m, _), r in ctx.products["train"].items() if m == "soft_token"]
    ps = method_test_prompts(cfg, inp, "soft_token", res.checkpoint, test_users(cfg, inp))
    from workbench.study.user_signal import FeatureEncoding

    enc = FeatureEncoding.fit(ctx.dataset.user_features, cfg.user_signal.max_categories)
    np.testing.assert_array_equal(ps.user_vectors, enc.transform(ctx.dataset.user_features)[ps.users])
    als_cfg, _ = study("als")
    als_inp = inputs_from_context(prepare_context(als_cfg))
    seed, lr = cfg.training.seeds[0], cfg.training.lr_grid[0]
    assert train_entry(als_cfg, als_inp, "none", seed, lr)[1] is not None  # trained once for both sources
    assert train_entry(als_cfg, als_inp, "soft_token", seed, lr)[1] is None  # its signal changed: a new model
