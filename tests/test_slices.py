"""The comparison table by history length: quartiles partition the test users, and a quartile's intervals are the
seeds-then-users bootstrap on its users."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import names
from workbench.study.compare import Entry, comparison_table
from workbench.study.intervals import mean_interval, seed_user_bootstrap
from workbench.names import SLICE, SLICE_USERS
from workbench.study.slices import history_quartiles, sliced_table

N10 = names.ndcg_at(10)
METRICS = (names.recall_at(10), N10, names.MRR)


def _entries(n: int, rng) -> dict[str, Entry]:
    """none and a method over 3 seeds, a seedless popularity; the method is better on short histories."""
    out = {}
    for name, seeds in (("none", (0, 1, 2)), ("soft_token", (0, 1, 2)), ("popularity", (0,))):
        e = Entry(name)
        for s in seeds:
            e.per_seed[s] = {m: rng.random(n) * 0.3 for m in METRICS}
        out[name] = e
    return out


def test_quartiles_partition_the_users():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 400, size=1001)
    lengths[:50] = 20  # ties at an edge
    sl = history_quartiles(lengths)
    e1, e2, e3 = sl.edges
    assert e1 < e2 < e3 and all(e in lengths for e in sl.edges)  # edges are lengths of the data
    masks = np.stack([sl.mask(i) for i in range(4)])
    assert (masks.sum(axis=0) == 1).all()  # each user in exactly one quartile
    assert (lengths[masks[0]] <= e1).all() and (lengths[masks[3]] > e3).all()
    assert ((lengths[masks[1]] > e1) & (lengths[masks[1]] <= e2)).all()
    assert ((lengths[masks[2]] > e2) & (lengths[masks[2]] <= e3)).all()
    assert all(abs(m.sum() - 250) < 30 for m in masks)  # about a quarter each
    assert sl.labels == (f"Q1 (<= {e1})", f"Q2 ({e1 + 1}-{e2})", f"Q3 ({e2 + 1}-{e3})", f"Q4 (> {e3})")
    t = sliced_table(_entries(len(lengths), rng), sl, 20, 0)
    per = t.drop_duplicates(SLICE)
    assert list(per[SLICE]) == list(sl.labels) and per[SLICE_USERS].sum() == len(lengths)
    # every user has the same length: one quartile holds them all, the empty ones are left out
    same = history_quartiles([7] * 12)
    assert same.labels[0] == "Q1 (<= 7)" and same.mask(0).all()
    t = sliced_table(_entries(12, rng), same, 20, 0)
    assert set(t[SLICE]) == {"Q1 (<= 7)"} and (t[SLICE_USERS] == 12).all()
    with pytest.raises(ValueError, match="one length per test user"):
        history_quartiles([])


def test_a_slice_interval_is_the_bootstrap_on_its_users():
    rng = np.random.default_rng(1)
    n = 400
    lengths = rng.integers(3, 300, size=n)
    entries = _entries(n, rng)
    sl = history_quartiles(lengths)
    t = sliced_table(entries, sl, 200, 7)
    for i, label in enumerate(sl.labels):
        m = sl.mask(i)
        row = t[(t[SLICE] == label) & (t["method"] == "soft_token")].iloc[0]
        a = [x[m] for x in entries["soft_token"].arrays(N10)]
        b = [x[m] for x in entries["none"].arrays(N10)]
        iv = seed_user_bootstrap(a, b, 200, 7)
        assert (row[f"vs_none/{N10}"], row[f"vs_none/{N10}_lo"], row[f"vs_none/{N10}_hi"]) == (iv.mean, iv.lo, iv.hi)
        mi = mean_interval(a, 200, 7)
        assert (row[N10], row[N10 + "_lo"], row[N10 + "_hi"]) == (mi.mean, mi.lo, mi.hi)
        pop = t[(t[SLICE] == label) & (t["method"] == "popularity")].iloc[0]  # a seedless row, paired with none
        iv = seed_user_bootstrap([entries["popularity"].arrays(N10)[0][m]], b, 200, 7)
        assert (pop[f"vs_none/{N10}"], pop[f"vs_none/{N10}_lo"]) == (iv.mean, iv.lo)
        assert row[SLICE_USERS] == m.sum()
    # the overall table is not any slice's: the restriction is what the slice rows measure
    full = comparison_table(entries, 200, 7).set_index("method")
    assert not (t[t["method"] == "soft_token"][N10] == full.loc["soft_token", N10]).any()


def test_the_slice_tables_render():
    from workbench.study.summary import format_slices, slices_markdown

    rng = np.random.default_rng(2)
    sl = history_quartiles(rng.integers(3, 300, size=200))
    t = sliced_table(_entries(200, rng), sl, 50, 0)
    md = slices_markdown(t)
    for label in sl.labels:
        assert f"### {label}: {int(sl.mask(sl.labels.index(label)).sum())} test users" in md
    short = format_slices(t)
    assert all(label in short for label in sl.labels)
    lines = [x for x in short.splitlines() if x.startswith("| ")]
    assert [x.split(" | ")[0] for x in lines] == ["| method", "| none", "| soft_token", "| popularity (baseline)",
                                                  "| soft_token - none", "| popularity (baseline) - none"]


def test_the_history_figure_draws_each_quartile_and_its_difference_vs_none():
    from workbench.study.summary import history_figure

    rng = np.random.default_rng(3)
    sl = history_quartiles(rng.integers(3, 300, size=240))
    t = sliced_table(_entries(240, rng), sl, 50, 0)
    t = t[t["method"] != "popularity"]
    fig = history_figure(t)
    top = {tr.name: tr for tr in fig.data if tr.yaxis == "y"}
    bottom = [tr for tr in fig.data if tr.yaxis == "y2"]
    assert set(top) == {"none", "soft_token"} and list(top["none"].x) == list(sl.labels)
    for label, y in zip(top["soft_token"].x, top["soft_token"].y):  # each bar is its quartile's row, not another's
        row = t[(t[SLICE] == label) & (t["method"] == "soft_token")].iloc[0]
        assert y == row[N10]
    (delta,) = bottom  # none has no difference with itself: one bar series below, soft_token's
    d = t[t["method"] == "soft_token"]
    assert list(delta.y) == list(d[f"vs_none/{N10}"])
    assert list(delta.error_y.array) == list(d[f"vs_none/{N10}_hi"] - d[f"vs_none/{N10}"])
    assert list(delta.error_y.arrayminus) == list(d[f"vs_none/{N10}"] - d[f"vs_none/{N10}_lo"])
    # a report of several studies: one group per study and quartile
    two = history_figure(t.assign(study="a"), by="study")
    assert list(two.data[0].x) == [f"a · {lab}" for lab in sl.labels]
