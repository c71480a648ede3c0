"""PrefixTrie: the allowed next tokens are exactly the valid continuations (brute force), bans included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.sids.layout import Catalog, SidLayout, add_dedup_digit


def _random_catalog(rng, n_items, codebooks, base_vocab, user_codebooks=(3, 2)):
    codes = np.stack([rng.integers(0, k, size=n_items) for k in codebooks], axis=1)
    full = add_dedup_digit(codes)
    layout = SidLayout(base_vocab, tuple(codebooks), int(full[:, -1].max()) + 1, tuple(user_codebooks))
    return Catalog(full, layout)


def _brute_force(cat: Catalog, prefix: list[int], banned: set[int]) -> np.ndarray:
    """Allowed[v] = some non-banned item's SID starts with prefix + [v]."""
    mask = np.zeros(cat.layout.vocab_size, dtype=bool)
    t = len(prefix)
    for item in range(cat.n_items):
        sid = cat.sid_tokens(item)
        if item not in banned and sid[:t] == prefix:
            mask[sid[t]] = True
    return mask


def _prefix_batch(rng, cat: Catalog, t: int, n: int) -> list[list[int]]:
    """Mostly valid prefixes of length t (from random items), some random (often invalid) ones."""
    out = []
    for _ in range(n):
        if t and rng.random() < 0.25:  # random tokens from the right blocks, or anywhere in the vocab
            if rng.random() < 0.5:
                out.append([int(cat.layout.item_level_offset(d) + rng.integers(0, cat.layout.item_block_sizes[d])) for d in range(t)])
            else:
                out.append([int(x) for x in rng.integers(0, cat.layout.vocab_size, size=t)])
        else:
            out.append(cat.sid_tokens(int(rng.integers(cat.n_items)))[:t])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_allowed_mask_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    codebooks = tuple(int(k) for k in rng.integers(2, 6, size=int(rng.integers(1, 4))))
    cat = _random_catalog(rng, int(rng.integers(5, 60)), codebooks, base_vocab=int(rng.integers(0, 50)))
    trie = cat.trie()
    for t in range(cat.depth):
        prefixes = _prefix_batch(rng, cat, t, 24)
        banned = [
            sorted(set(int(x) for x in rng.choice(cat.n_items, size=int(rng.integers(0, cat.n_items)), replace=False)))
            for _ in prefixes
        ]
        pt = torch.tensor(prefixes, dtype=torch.long).reshape(len(prefixes), t)
        plain = trie.allowed_mask(pt).numpy()
        with_bans = trie.allowed_mask(pt, banned=banned).numpy()
        precomputed = trie.allowed_mask(pt, banned_counts=trie.banned_counts(banned, t)).numpy()
        for r, p in enumerate(prefixes):
            np.testing.assert_array_equal(plain[r], _brute_force(cat, p, set()), err_msg=f"t={t} prefix={p}")
            np.testing.assert_array_equal(with_bans[r], _brute_force(cat, p, set(banned[r])), err_msg=f"t={t} prefix={p} banned")
        np.testing.assert_array_equal(precomputed, with_bans)


def test_every_item_reachable_and_fully_banned_prefix_closed():
    rng = np.random.default_rng(7)
    cat = _random_catalog(rng, 40, (3, 3), base_vocab=5)
    trie = cat.trie()
    # greedy walk along each item's SID: every token is allowed at its step
    for item in range(cat.n_items):
        sid = cat.sid_tokens(item)
        for t in range(cat.depth):
            mask = trie.allowed_mask(torch.tensor([sid[:t]], dtype=torch.long).reshape(1, t))
            assert mask[0, sid[t]]
    # banning every item under a first-level code closes that code
    first = cat.sid_tokens(0)[0]
    under = [i for i in range(cat.n_items) if cat.sid_tokens(i)[0] == first]
    mask = trie.allowed_mask(torch.zeros(1, 0, dtype=torch.long), banned=[under])
    assert not mask[0, first]
    # banning every item closes everything
    mask = trie.allowed_mask(torch.zeros(1, 0, dtype=torch.long), banned=[list(range(cat.n_items))])
    assert not mask.any()


def test_duplicate_banned_items_count_once():
    codes = add_dedup_digit(np.array([[0, 0], [0, 0], [1, 0]]))  # items 0 and 1 share prefix <a_0><b_0>
    cat = Catalog(codes, SidLayout(0, (2, 1), dedup_size=2))
    trie = cat.trie()
    mask = trie.allowed_mask(torch.zeros(1, 0, dtype=torch.long), banned=[[0, 0]])  # item 0 banned twice
    assert mask[0, cat.sid_tokens(1)[0]], "item 1 is still reachable under <a_0>"


def test_complete_sid_rejected():
    rng = np.random.default_rng(0)
    cat = _random_catalog(rng, 10, (2, 2), base_vocab=0)
    full = torch.tensor([cat.sid_tokens(0)])
    with pytest.raises(ValueError, match="complete"):
        cat.trie().allowed_mask(full)


def test_masks_are_built_on_the_tries_device():
    """A trie moved to a device makes every tensor there (the meta device stands in for a GPU: no memory, and a
    CPU tensor mixed in fails); the moved copy gives the CPU trie's masks; the original stays on the CPU."""
    rng = np.random.default_rng(3)
    cat = _random_catalog(rng, 200, (4, 4, 3), base_vocab=10)
    trie = cat.trie()
    on_meta = trie.to("meta")
    assert on_meta.device.type == "meta" and trie.device.type == "cpu" and trie.to("cpu") is trie
    prefixes = torch.tensor(_prefix_batch(rng, cat, 2, 8), dtype=torch.long)
    counts = on_meta.banned_counts([[1, 2, 3]] * 8, 2)
    mask = on_meta.allowed_mask(prefixes.to("meta"), banned_counts=counts, vocab_size=cat.layout.vocab_size + 7)
    assert mask.device.type == "meta" and mask.shape == (8, cat.layout.vocab_size + 7)
    wide = trie.allowed_mask(prefixes, banned=[[1, 2, 3]] * 8, vocab_size=cat.layout.vocab_size + 7)
    assert not wide[:, cat.layout.vocab_size:].any()  # the padded columns beyond the layout: never allowed
    assert torch.equal(wide[:, : cat.layout.vocab_size], trie.allowed_mask(prefixes, banned=[[1, 2, 3]] * 8))


def test_engine_constraint_mask_makes_no_host_round_trip(monkeypatch):
    """The torch engine's per-step mask: from prefixes on the trie's device, without `.cpu()` (which on a GPU waits
    for the device and copies the prefixes back every step) and without a host-built mask copied over."""
    from workbench.engines.torch.search import constraint_mask

    rng = np.random.default_rng(4)
    cat = _random_catalog(rng, 100, (4, 4), base_vocab=10)
    on_meta = cat.trie().to("meta")
    prefixes = torch.tensor(_prefix_batch(rng, cat, 1, 5), dtype=torch.long).to("meta")

    def no_host(self, *a, **k):
        raise AssertionError("a tensor went back to the host")

    monkeypatch.setattr(torch.Tensor, "cpu", no_host)
    mask = constraint_mask(on_meta, prefixes, cat.layout.vocab_size + 3)
    assert mask.device.type == "meta" and mask.shape == (5, cat.layout.vocab_size + 3)
