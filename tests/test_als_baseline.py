"""ALS dot-product ranker: equals a brute-force sort, never returns a seen item, chunking-invariant."""

from __future__ import annotations

import numpy as np

from workbench.study.baselines import als_rank
from workbench.study.evaluate import top_k_excluding


def _brute_force(u: np.ndarray, v: np.ndarray, seen, k: int) -> list[list[int]]:
    """Sort every unseen item by (-score, item id) in plain Python."""
    out = []
    for i in range(len(u)):
        banned = {int(x) for x in seen[i]}
        scored = [(-float(u[i] @ v[j]), j) for j in range(len(v)) if j not in banned]
        out.append([j for _, j in sorted(scored)[:k]])
    return out


def test_tiny_hand_made_example():
    # 3 users x 5 items, f = 2; scores: user 0 -> [1, 2, 3, 2, -1], user 1 -> [0, 1, 2, 1, -1], user 2 -> 0
    v = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 1.0], [0.0, -1.0]])  # [5, 2]
    u = np.array([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])  # user 1 has ties at 1; user 2 all zeros
    seen = [np.array([2]), np.array([4, 0]), np.array([], dtype=np.int64)]
    got = als_rank(u, v, seen, k=3)
    # user 0: item 2 banned; 1 and 3 tie at 2 -> id order; then 0 (score 1)
    # user 1: items 4, 0 banned; 2 (score 2), then 1 and 3 tie at 1 -> id order
    # user 2: every score 0 -> the three lowest ids
    assert [g.tolist() for g in got] == [[1, 3, 0], [2, 1, 3], [0, 1, 2]]
    assert [g.tolist() for g in got] == _brute_force(u, v, seen, 3)
    assert all(g.dtype == np.int64 for g in got)


def test_random_matches_brute_force_and_bans_seen():
    rng = np.random.default_rng(0)
    n, n_items, f, k = 57, 40, 4, 10
    u, v = rng.normal(size=(n, f)), rng.normal(size=(n_items, f))
    v[7] = v[3]  # exact ties between two items for every user
    seen = [rng.choice(n_items, size=rng.integers(0, 35), replace=False) for _ in range(n)]
    seen[5] = np.arange(n_items - 2)  # only two unseen items: a short list, no -inf entries
    got = als_rank(u, v, seen, k)
    assert [g.tolist() for g in got] == _brute_force(u, v, seen, k)
    assert all(not np.isin(g, s).any() for g, s in zip(got, seen))
    assert got[5].tolist() == sorted(range(n_items - 2, n_items), key=lambda j: -(u[5] @ v[j]))
    # agrees with the shared helper wherever scores are distinct (that helper's tie order is unspecified)
    v2 = rng.normal(size=(n_items, f))
    ref = top_k_excluding(u @ v2.T, seen, k)
    assert [g.tolist() for g in als_rank(u, v2, seen, k)] == ref


def test_chunking_does_not_change_results():
    rng = np.random.default_rng(1)
    n, n_items, f = 101, 300, 8
    u, v = rng.normal(size=(n, f)), np.round(rng.normal(size=(n_items, f)), 1)  # rounding makes ties likely
    u = np.round(u)
    seen = [rng.choice(n_items, size=rng.integers(0, 50), replace=False) for _ in range(n)]
    for vv in (v, rng.normal(size=(n_items, f))):  # tie-heavy, then continuous scores
        full = als_rank(u, vv, seen, 20, chunk=4096)
        for chunk in (1, 7, 64):
            assert all(np.array_equal(a, b) for a, b in zip(als_rank(u, vv, seen, 20, chunk=chunk), full))
