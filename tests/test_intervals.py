"""The seeds-then-users bootstrap: seed variance is in the interval, ties to the user bootstrap."""

from __future__ import annotations

import time

import numpy as np
import pytest

from workbench.study.evaluate import paired_bootstrap
from workbench.study.intervals import Interval, mean_interval, seed_user_bootstrap


def _bernoulli_runs(rng: np.random.Generator, p: np.ndarray, shifts: np.ndarray) -> list[np.ndarray]:
    """One per-user 0/1 metric array per seed: user u hits with probability p[u] + shifts[s]."""
    return [(rng.random(len(p)) < np.clip(p + sh, 0.0, 1.0)).astype(np.float64) for sh in shifts]


def test_seed_variance_widens_the_interval():
    # seed means 0.40 / 0.50 / 0.60, per-user noise tiny: the spread is all seed-to-seed
    rng = np.random.default_rng(0)
    n = 2000
    a = [0.5 + sh + rng.normal(0.0, 0.01, n) for sh in (-0.1, 0.0, 0.1)]
    b = [np.full(n, 0.5)]  # a seedless baseline, broadcast over a's seeds
    two_level = seed_user_bootstrap(a, b, n_boot=1000, seed=1)
    users_only = paired_bootstrap(a[1], b[0], n_boot=1000, seed=1)
    assert two_level.n_seeds == 3 and two_level.n_users == n
    assert two_level.per_seed == pytest.approx((-0.1, 0.0, 0.1), abs=2e-3)
    assert two_level.mean == pytest.approx(0.0, abs=2e-3)
    # the seed draw alone spans roughly +-0.1 * sqrt(2/3) / sqrt(3) ... +-0.1: far beyond user noise
    assert two_level.width > 0.08
    assert two_level.width > 50 * (users_only[2] - users_only[1])
    assert two_level.contains_zero


def test_identical_inputs_have_zero_width():
    rng = np.random.default_rng(2)
    a = [rng.random(500) for _ in range(3)]
    iv = seed_user_bootstrap(a, [x.copy() for x in a], n_boot=200)
    assert (iv.mean, iv.lo, iv.hi) == (0.0, 0.0, 0.0)
    assert iv.width == 0.0 and iv.contains_zero
    assert iv.format() == "+0.000 [+0.000, +0.000]"


def test_one_seed_is_the_paired_user_bootstrap():
    rng = np.random.default_rng(3)
    n = 3000
    p = rng.uniform(0.05, 0.4, n)
    a, b = _bernoulli_runs(rng, p, np.array([0.03])), _bernoulli_runs(rng, p, np.array([0.0]))
    iv = seed_user_bootstrap(a, b, n_boot=2000, seed=4)
    mean, lo, hi = paired_bootstrap(a[0], b[0], n_boot=2000, seed=5)
    assert iv.mean == pytest.approx(mean, abs=1e-12)
    # percentile Monte Carlo error at 2,000 replicates is ~5% of the half-width
    half = (hi - lo) / 2
    assert iv.lo == pytest.approx(lo, abs=0.1 * half)
    assert iv.hi == pytest.approx(hi, abs=0.1 * half)


def test_known_difference_is_covered():
    # 200 synthetic studies: 3 seeds with a small seed effect, 500 users, true difference 0.05
    delta, n, covered = 0.05, 500, 0
    for r in range(200):
        rng = np.random.default_rng(1000 + r)
        p = rng.uniform(0.1, 0.5, n)
        a = _bernoulli_runs(rng, p + delta, rng.normal(0.0, 0.01, 3))
        b = _bernoulli_runs(rng, p, np.zeros(1))
        iv = seed_user_bootstrap(a, b, n_boot=300, seed=r)
        covered += iv.lo <= delta <= iv.hi
    assert covered >= 180, covered  # >= 90% at level 0.95 (measured 98%: conservative here)


def test_mean_interval_and_broadcast():
    rng = np.random.default_rng(6)
    a = [rng.random(400) + s for s in range(3)]
    iv = mean_interval(a, n_boot=500)
    assert iv.mean == pytest.approx(np.mean(a)) and iv.lo < iv.mean < iv.hi
    assert iv.per_seed == pytest.approx(tuple(x.mean() for x in a))
    # a seedless side on the left broadcasts too; mismatched seed counts or users are errors
    left = seed_user_bootstrap([a[0]], a, n_boot=100)
    assert left.per_seed == pytest.approx(tuple(a[0].mean() - x.mean() for x in a))
    with pytest.raises(ValueError):
        seed_user_bootstrap(a, a[:2])
    with pytest.raises(ValueError):
        seed_user_bootstrap(a, [x[:-1] for x in a])


def test_study_sized_call_is_fast():
    rng = np.random.default_rng(7)
    a = [rng.random(6040) for _ in range(3)]
    b = [rng.random(6040) for _ in range(3)]
    t0 = time.perf_counter()
    iv = seed_user_bootstrap(a, b, n_boot=1000)
    assert isinstance(iv, Interval)
    assert time.perf_counter() - t0 < 1.0


def test_verdicts_say_what_the_intervals_decide():
    """The table's comparisons in words: ahead / behind only when the seed-and-user interval excludes 0."""
    from workbench import names
    from workbench.study.compare import Entry, comparison_table
    from workbench.study.summary import verdicts

    rng = np.random.default_rng(0)
    n10, metrics = names.ndcg_at(10), (names.recall_at(10), names.ndcg_at(10), names.MRR)

    def entry(name, shift):
        e = Entry(name)
        for seed in range(3):
            base = rng.random(400) * 0.3  # per-user noise, different per seed
            e.per_seed[seed] = {m: np.clip(base + shift, 0, 1) for m in metrics}
        return e

    entries = {"none": entry("none", 0.0), "als": entry("als", 0.1), "ahead": entry("ahead", 0.3),
               "behind": entry("behind", -0.3), "level": entry("level", 0.0)}
    lines = verdicts(comparison_table(entries, 300, 0))
    said = {v.split(" vs ")[0]: v for v in lines if " vs none:" in v}
    assert said["ahead"].endswith("ahead is ahead") and said["behind"].endswith("behind is behind")
    assert said["level"].endswith("undecided (the interval holds 0)")
    # no row is compared with itself; none vs ALS is said on none's row, so als's row does not say it again
    assert set(said) == {"ahead", "behind", "level"}
    assert len([v for v in lines if v.startswith(("none vs ALS", "als vs none"))]) == 1
    assert n10 in comparison_table(entries, 50, 0).columns
