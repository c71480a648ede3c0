"""Residual quantizers: codes in range, unique SIDs after dedup, deterministic, stats that mean something."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.config import SemanticIdConfig, UserSidConfig
from workbench.sids.quantize import (
    RQVAE,
    RQKMeans,
    code_stats,
    dedup_size_for,
    item_sids,
    load_quantizer,
    make_quantizer,
    make_quantizer_of_kind,
    quantizer_stats,
)
from workbench.sids.layout import Catalog, SidLayout


def _clustered(n=300, d=16, centers=12, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centers, d)) * 3
    return (c[rng.integers(0, centers, n)] + rng.normal(size=(n, d))).astype(np.float32)


def _make(kind: str, levels=2, k=8, seed=0):
    cfg = SemanticIdConfig(kind=kind, levels=levels, codebook_size=k, kmeans_iters=10, vae_epochs=8, vae_hidden=32, vae_latent=8)
    return make_quantizer(cfg, seed)


@pytest.mark.parametrize("kind", ["rq_kmeans", "rq_vae"])
def test_codes_in_range_and_unique_after_dedup(kind):
    x = _clustered()
    res = item_sids(_make(kind, levels=2, k=8), x)
    assert res.codes.shape == (len(x), 2) and res.item_codes.shape == (len(x), 3)
    assert res.codes.min() >= 0 and res.codes.max() < 8
    assert len(np.unique(res.item_codes, axis=0)) == len(x), "SIDs must be unique after the dedup digit"
    assert res.stats["max_prefix_group"] == res.max_dedup + 1
    # the deduplicated codes form a valid catalog with the layout helper's dedup size
    layout = SidLayout(50, res.quantizer.codebook_sizes, dedup_size_for(res.max_dedup))
    cat = Catalog(res.item_codes, layout)
    assert all(cat.item_of(cat.sid_tokens(i)) == i for i in range(0, len(x), 17))


@pytest.mark.parametrize("kind", ["rq_kmeans", "rq_vae"])
def test_deterministic_for_a_seed_and_save_load(kind, tmp_path):
    x = _clustered(seed=1)
    a = _make(kind).fit(x)
    b = _make(kind).fit(x)
    codes = a.encode(x)
    np.testing.assert_array_equal(codes, b.encode(x))
    np.testing.assert_allclose(a.decode(codes), b.decode(codes), atol=1e-6)
    a.save(tmp_path / "q.npz")
    c = load_quantizer(tmp_path / "q.npz")
    assert c.kind == kind and c.codebook_sizes == a.codebook_sizes
    np.testing.assert_array_equal(c.encode(x), codes)
    np.testing.assert_allclose(c.decode(codes), a.decode(codes), atol=1e-5)


def test_rq_kmeans_levels_reduce_error_and_beat_a_random_codebook():
    x = _clustered(n=400, d=8, centers=20, seed=2)
    errs = [item_sids(RQKMeans(levels, 8, iters=20, seed=0), x).stats["quantization_error"] for levels in (1, 2, 3)]
    assert errs[0] > errs[1] > errs[2]
    rng = np.random.default_rng(0)
    bad = RQKMeans(1, 8)
    bad.codebooks = [rng.normal(size=(8, 8)).astype(np.float32)]  # an unfitted, random codebook
    random_err = quantizer_stats(bad, x, bad.encode(x))["quantization_error"]
    assert errs[0] < random_err


def test_rq_vae_trains_and_uses_its_codebooks():
    x = _clustered(n=300, d=16, centers=12, seed=3)
    q = RQVAE(2, 8, hidden=32, latent=8, epochs=20, seed=0)
    res = item_sids(q, x)
    assert q.history[-1] < q.history[0], "training loss should go down"
    assert res.stats["utilization_l0"] >= 0.75, res.stats  # dead-code restarts keep codes in use
    assert res.stats["quantization_error"] < 0.9


def test_fewer_distinct_points_than_codes():
    x = np.repeat(np.eye(3, dtype=np.float32), 4, axis=0)  # 12 rows, 3 distinct
    for kind in ("rq_kmeans", "rq_vae"):
        res = item_sids(_make(kind, levels=2, k=8), x)
        assert res.codes.max() < 8
        assert len(np.unique(res.item_codes, axis=0)) == 12


def test_code_stats_by_hand():
    codes = np.array([[0, 0], [0, 0], [0, 1], [1, 2], [1, 2], [1, 2]])
    s = code_stats(codes, (4, 4))
    assert s["utilization_l0"] == 0.5 and s["utilization_l1"] == 0.75
    assert s["collision_rate"] == pytest.approx(5 / 6)  # only [0, 1] is alone
    assert s["unique_share"] == pytest.approx(3 / 6)
    assert s["max_prefix_group"] == 3 and s["max_prefix_group_l1"] == 3


def test_dedup_size_rounding():
    assert [dedup_size_for(d) for d in (0, 1, 2, 3, 4, 7, 8)] == [1, 2, 4, 4, 8, 8, 16]


def test_user_quantizer_from_config_has_no_dedup():
    x = _clustered(n=200, d=8, seed=4)
    uq = make_quantizer(UserSidConfig(levels=2, codebook_size=4, kmeans_iters=10), seed=0).fit(x)
    codes = uq.encode(x)
    assert codes.shape == (200, 2) and codes.max() < 4
    assert code_stats(codes, uq.codebook_sizes)["collision_rate"] > 0.9  # 16 cells, 200 users: shared


def test_unknown_kind():
    with pytest.raises(ValueError, match="rq_kmeans"):
        make_quantizer_of_kind("pq", SemanticIdConfig())
