"""Prompt builders: exact token layouts, one placeholder, text truncation, and no leakage at evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.study.prompts import (
    Interactions,
    PromptBuilder,
    PromptError,
    UserEncoder,
    eval_examples,
)
from workbench.sids.layout import SidLayout, add_dedup_digit

LAYOUT = SidLayout(base_vocab_size=100, item_codebooks=(4, 4), dedup_size=3, user_codebooks=(5, 5))
N_ITEMS = 20


def _codes():
    rng = np.random.default_rng(0)
    return add_dedup_digit(np.stack([rng.integers(0, 4, N_ITEMS), rng.integers(0, 4, N_ITEMS)], 1))


CODES = _codes()
assert CODES[:, -1].max() < 3
SIDS = LAYOUT.item_codes_to_ids(CODES)
# item i's text is the 2 tokens [10 + i, 50 + i % 3] (distinct per item, lengths fixed)
TEXT = [[10 + i, 50 + i % 3] for i in range(N_ITEMS)]
sp = LAYOUT.special_id
HIST, TXT, USID, NXT, SEP, USER = sp("<|hist|>"), sp("<|text|>"), sp("<|usid|>"), sp("<|next|>"), sp("<|sep|>"), LAYOUT.placeholder_id


def builder(method, k=2, m=4, max_tokens=1024):
    return PromptBuilder(method, LAYOUT, SIDS, recent_k=k, long_m=m, item_text_ids=TEXT, max_prompt_tokens=max_tokens)


def S(*items):
    return [t for i in items for t in SIDS[i].tolist()]


HISTORY = [3, 7, 1, 9, 4, 12]


def test_none_and_none_long_layouts():
    ids, pos = builder("none").build(HISTORY)
    assert ids == [HIST, *S(4, 12)] and pos is None  # a SID stream: the next SID follows directly
    ids, pos = builder("none_long").build(HISTORY)
    assert ids == [HIST, *S(1, 9, 4, 12)] and pos is None


def test_text_history_layout():
    ids, _ = builder("text_history").build(HISTORY)
    text = [TXT, *TEXT[1], SEP, *TEXT[9], SEP, *TEXT[4], SEP, *TEXT[12]]
    assert ids == text + [NXT]  # the history as text only; the target is written as a SID


def test_text_history_truncation_drops_oldest_whole_items():
    tail = 1  # <|next|>
    # room for <|text|> + two items (2 tokens each) + one separator = 6
    ids, _ = builder("text_history", max_tokens=tail + 6).build(HISTORY)
    assert ids == [TXT, *TEXT[4], SEP, *TEXT[12], NXT]
    assert len(ids) <= tail + 6
    # the long history never exceeds M items even with room to spare
    ids, _ = builder("text_history", m=2).build(HISTORY)
    assert ids[: 1 + 5] == [TXT, *TEXT[4], SEP, *TEXT[12]]


def test_user_sid_and_soft_token_layouts():
    usid = LAYOUT.user_codes_to_ids(np.array([[2, 4]]))[0]
    ids, pos = builder("user_sid").build(HISTORY, usid)
    assert ids == [USID, *usid.tolist(), HIST, *S(4, 12)] and pos is None
    ids, pos = builder("soft_token").build(HISTORY)
    assert ids == [USER, HIST, *S(4, 12)] and pos == 0
    assert ids.count(USER) == 1
    for m in ("none", "none_long", "text_history"):
        assert USER not in builder(m).build(HISTORY)[0]


def test_short_history_and_errors():
    assert builder("none").build([5])[0] == [HIST, *S(5)]
    with pytest.raises(PromptError, match="SID tokens"):
        builder("user_sid").build(HISTORY)
    with pytest.raises(PromptError, match="max_prompt_tokens"):
        builder("none_long", max_tokens=5).build(HISTORY)
    with pytest.raises(PromptError, match="unknown method"):
        builder("bogus")


class RecordingEncoder:
    """Fold-in stand-in that records what it was given: vector = counts of items seen."""

    def __init__(self):
        self.calls = []

    def vectors(self, users, lists, as_of):
        self.calls.append([list(map(int, l)) for l in lists])
        out = np.zeros((len(lists), N_ITEMS), np.float32)
        for i, l in enumerate(lists):
            np.add.at(out[i], np.asarray(l, dtype=np.int64), 1.0)
        return out

    def codes(self, v):
        return np.stack([v.argmax(1) % 5, (v.sum(1) % 5).astype(int)], 1)

    def encoder(self):
        return UserEncoder(self.vectors, N_ITEMS, self.codes)


def _data():
    rng = np.random.default_rng(1)
    train = [rng.permutation(N_ITEMS)[: n].astype(np.int64) for n in (8, 5, 3)]
    valid = np.array([int(np.setdiff1d(np.arange(N_ITEMS), t)[0]) for t in train])
    test = np.array([int(np.setdiff1d(np.arange(N_ITEMS), np.r_[t, v])[0]) for t, v in zip(train, valid)])
    return Interactions(train, valid, test, N_ITEMS)


def test_eval_examples_histories():
    data = _data()
    rec = RecordingEncoder()
    b = builder("soft_token")
    va = eval_examples(b, data, "valid", rec.encoder())
    te = eval_examples(b, data, "test", rec.encoder(), users=[2, 0])
    assert va.targets.tolist() == data.valid.tolist()
    assert [s.tolist() for s in va.seen] == [s.tolist() for s in data.train]
    assert te.users.tolist() == [2, 0] and te.targets.tolist() == [data.test[2], data.test[0]]
    assert te.seen[0].tolist() == [*data.train[2].tolist(), data.valid[2]]
    # the signal is folded in from the history before the k=2 items the prompt shows (train + valid, never test)
    assert rec.calls[1][0] == te.seen[0].tolist()[:-2]
    assert rec.calls[0][0] == va.seen[0].tolist()[:-2]
    assert data.test[2] not in rec.calls[1][0]
    p = te.engine_prompt(0)
    assert p.placeholder_pos == 0 and p.token_ids[0] == USER and len(p.user_vector) == N_ITEMS


@pytest.mark.parametrize("variant", ["shuffled", "zeroed"])
def test_signal_variants_replace_only_the_signal(variant):
    data = _data()
    rec = RecordingEncoder()
    zero = LAYOUT.user_codes_to_ids(np.zeros((1, 2), dtype=np.int64))[0].tolist()
    for method in ("soft_token", "user_sid"):
        ps = eval_examples(builder(method), data, "test", rec.encoder())
        v = ps.with_signal(variant, seed=3, zero_user_sid=zero)
        assert v.targets.tolist() == ps.targets.tolist() and [s.tolist() for s in v.seen] == [s.tolist() for s in ps.seen]
        if method == "soft_token":
            assert v.prompts == ps.prompts
            if variant == "zeroed":
                assert not v.user_vectors.any()
            else:
                assert sorted(map(tuple, v.user_vectors.tolist())) == sorted(map(tuple, ps.user_vectors.tolist()))
        else:
            assert [p[3:] for p in v.prompts] == [p[3:] for p in ps.prompts]  # only U (positions 1-2) changes
            us = [p[1:3] for p in v.prompts]
            assert all(u == zero for u in us) if variant == "zeroed" else sorted(us) == sorted(p[1:3] for p in ps.prompts)
            assert ps.with_signal(variant, seed=3).prompts == v.prompts  # the layout's zero codes by default
    assert eval_examples(builder("none"), data, "test").with_signal("own") is not None
    with pytest.raises(PromptError):
        eval_examples(builder("none"), data, "test").with_signal("zeroed")
