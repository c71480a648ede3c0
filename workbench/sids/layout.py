"""Semantic-ID token layout, the item catalog and the prefix trie of valid SIDs.

A Semantic ID (SID) is a short tuple of codes, one per quantizer level, plus a final dedup digit
that makes every item's SID unique: item 17 -> (12, 201, 7, 0) -> `<a_12><b_201><c_7><d_0>`.
Users get their own SIDs from a separately fitted quantizer, written with their own token block
(`<ua_3><ub_40>`), so an item code and a user code never share a token.

This module defines the token layout exactly once. The tokenizer extension (model/backbone.py), the prompt
builders (study/prompts.py) and every engine derive token ids from `SidLayout`, never by hand:

    ids = [base_vocab_size ...)  item level 0 | item level 1 | ... | dedup | user level 0 | ...
          then the special tokens (`SPECIAL_TOKENS`, in that order)

The trie answers "which tokens may come next" for a batch of partial SIDs as one tensor op per
decode step (no Python loop per beam), with an optional per-request set of banned items (items the
user already saw); a prefix whose every completion is banned is itself disallowed.

Quantizers that produce the codes live in `quantize.py`; this module only consumes codes.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

# Special tokens appended after the SID blocks. `<|user|>` is the soft-token placeholder.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|user|>",  # soft-token placeholder: its embedding is replaced by the projected user vector
    "<|hist|>",  # starts the recent-history SID list
    "<|text|>",  # starts the text-history block
    "<|usid|>",  # starts the user Semantic ID
    "<|next|>",  # "the next item is": generation starts right after this token
    "<|sep|>",  # separates items in a history
)
PLACEHOLDER_TOKEN = "<|user|>"


def _level_letter(level: int) -> str:
    return string.ascii_lowercase[level]


@dataclass(frozen=True)
class SidLayout:
    """Token blocks for item SID levels, the dedup digit, user SID levels and special tokens.

    `item_codebooks[i]` is the codebook size of item level i; `dedup_size` the number of dedup
    tokens (the largest number of items that may share the item codes); `user_codebooks` the
    codebook sizes of the user quantizer (may be empty).
    """

    base_vocab_size: int
    item_codebooks: tuple[int, ...]
    dedup_size: int
    user_codebooks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.base_vocab_size < 0:
            raise ValueError(f"base_vocab_size must be >= 0, got {self.base_vocab_size}")
        if not self.item_codebooks or min(self.item_codebooks) < 1:
            raise ValueError(f"item_codebooks must be non-empty positive sizes, got {self.item_codebooks}")
        if self.dedup_size < 1:
            raise ValueError(f"dedup_size must be >= 1, got {self.dedup_size}")
        if len(self.item_codebooks) + 1 > 26 or len(self.user_codebooks) > 26:
            raise ValueError("at most 25 item levels and 26 user levels are supported")

    # ---- block geometry -------------------------------------------------------------------
    @property
    def item_depth(self) -> int:
        """Tokens per item SID: the quantizer levels plus the dedup digit."""
        return len(self.item_codebooks) + 1

    @property
    def item_block_sizes(self) -> tuple[int, ...]:
        return (*self.item_codebooks, self.dedup_size)

    def _offsets(self) -> list[int]:
        sizes = [*self.item_block_sizes, *self.user_codebooks]
        offs, acc = [], self.base_vocab_size
        for s in sizes:
            offs.append(acc)
            acc += s
        offs.append(acc)  # start of special tokens
        return offs

    def item_level_offset(self, level: int) -> int:
        """First token id of item level `level` (the dedup level is `item_depth - 1`)."""
        if not 0 <= level < self.item_depth:
            raise IndexError(f"item level {level} out of range 0..{self.item_depth - 1}")
        return self._offsets()[level]

    def user_level_offset(self, level: int) -> int:
        if not 0 <= level < len(self.user_codebooks):
            raise IndexError(f"user level {level} out of range 0..{len(self.user_codebooks) - 1}")
        return self._offsets()[self.item_depth + level]

    @property
    def special_offset(self) -> int:
        return self._offsets()[-1]

    @property
    def vocab_size(self) -> int:
        """Base vocabulary plus every SID token and special token."""
        return self.special_offset + len(SPECIAL_TOKENS)

    @property
    def num_new_tokens(self) -> int:
        return self.vocab_size - self.base_vocab_size

    def special_id(self, token: str) -> int:
        try:
            return self.special_offset + SPECIAL_TOKENS.index(token)
        except ValueError:
            raise KeyError(f"unknown special token {token!r}; known: {SPECIAL_TOKENS}") from None

    @property
    def placeholder_id(self) -> int:
        return self.special_id(PLACEHOLDER_TOKEN)

    # ---- names -----------------------------------------------------------------------------
    def token_names(self) -> list[str]:
        """Names of every new token, in id order starting at `base_vocab_size`."""
        names: list[str] = []
        for lvl, size in enumerate(self.item_block_sizes):
            names += [f"<{_level_letter(lvl)}_{c}>" for c in range(size)]
        for lvl, size in enumerate(self.user_codebooks):
            names += [f"<u{_level_letter(lvl)}_{c}>" for c in range(size)]
        names += list(SPECIAL_TOKENS)
        return names

    # ---- codes <-> token ids ---------------------------------------------------------------
    def item_codes_to_ids(self, codes: np.ndarray) -> np.ndarray:
        """[n, item_depth] codes (last column = dedup digit) -> [n, item_depth] token ids."""
        codes = np.asarray(codes, dtype=np.int64)
        if codes.ndim != 2 or codes.shape[1] != self.item_depth:
            raise ValueError(f"expected item codes of shape [n, {self.item_depth}], got {codes.shape}")
        sizes = np.asarray(self.item_block_sizes)
        if (codes < 0).any() or (codes >= sizes).any():
            raise ValueError(f"item codes out of range for codebook sizes {tuple(sizes)}")
        offs = np.asarray(self._offsets()[: self.item_depth])
        return codes + offs

    def item_ids_to_codes(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        return ids - np.asarray(self._offsets()[: self.item_depth])

    def user_codes_to_ids(self, codes: np.ndarray) -> np.ndarray:
        """[n, user_levels] codes -> token ids in the user block."""
        codes = np.asarray(codes, dtype=np.int64)
        n_lvl = len(self.user_codebooks)
        if codes.ndim != 2 or codes.shape[1] != n_lvl:
            raise ValueError(f"expected user codes of shape [n, {n_lvl}], got {codes.shape}")
        sizes = np.asarray(self.user_codebooks)
        if (codes < 0).any() or (codes >= sizes).any():
            raise ValueError(f"user codes out of range for codebook sizes {tuple(sizes)}")
        offs = np.asarray(self._offsets()[self.item_depth : self.item_depth + n_lvl])
        return codes + offs

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SidLayout":
        return cls(
            base_vocab_size=int(d["base_vocab_size"]),
            item_codebooks=tuple(int(x) for x in d["item_codebooks"]),
            dedup_size=int(d["dedup_size"]),
            user_codebooks=tuple(int(x) for x in d.get("user_codebooks", ())),
        )


def add_dedup_digit(codes: np.ndarray) -> np.ndarray:
    """Append a digit that numbers items sharing the same codes (0, 1, 2, ... in row order).

    [n, levels] -> [n, levels + 1]; every row of the result is unique.
    """
    codes = np.asarray(codes, dtype=np.int64)
    _, inverse = np.unique(codes, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    sorted_groups = inverse[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_groups)) + 1]
    group_start = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    dedup = np.empty(len(codes), dtype=np.int64)
    dedup[order] = np.arange(len(order)) - group_start
    return np.concatenate([codes, dedup[:, None]], axis=1)


class Catalog:
    """SID <-> item in both directions, over item indices 0..n_items-1.

    `item_codes` is [n_items, item_depth] including the dedup digit; rows must be unique.
    """

    def __init__(self, item_codes: np.ndarray, layout: SidLayout):
        item_codes = np.asarray(item_codes, dtype=np.int64)
        self.layout = layout
        self.item_codes = item_codes
        self.item_token_ids = layout.item_codes_to_ids(item_codes)  # [n_items, depth]
        keys = [tuple(r) for r in self.item_token_ids.tolist()]
        self._by_tokens = {k: i for i, k in enumerate(keys)}
        if len(self._by_tokens) != len(keys):
            raise ValueError("item SIDs are not unique; add a dedup digit (add_dedup_digit)")

    @property
    def n_items(self) -> int:
        return len(self.item_codes)

    @property
    def depth(self) -> int:
        return self.layout.item_depth

    def sid_tokens(self, item: int) -> list[int]:
        return self.item_token_ids[item].tolist()

    def sid_string(self, item: int) -> str:
        names = self.layout.token_names()
        base = self.layout.base_vocab_size
        return "".join(names[t - base] for t in self.item_token_ids[item])

    def item_of(self, token_ids: Sequence[int]) -> int | None:
        """The item whose SID is exactly `token_ids`, or None for an invalid SID."""
        return self._by_tokens.get(tuple(int(t) for t in token_ids))

    def trie(self) -> "PrefixTrie":
        return PrefixTrie(self.item_token_ids, self.layout.vocab_size)


class PrefixTrie:
    """Valid-SID constraint as dense per-depth transition tables.

    Nodes at depth t are the distinct t-token prefixes. `children[t]` is [n_nodes_t, vocab_t]
    (vocab_t = width of the token block at depth t) holding the child node id or -1; the allowed
    mask at depth t is `children[t][node] >= 0`, shifted into the full vocabulary. Banned items
    are handled by counting, per request, the banned leaves under each node: a child is allowed
    only while it still has at least one non-banned leaf.

    The tables live on one device (`to(device)`; the CPU when built) and every tensor the methods make is made
    there, by gathers and `where` (no boolean indexing, whose result size the host must wait for): a GPU
    engine builds its per-step masks on the GPU, with no copy from the host.
    """

    def __init__(self, sid_token_ids: np.ndarray, vocab_size: int):
        import torch

        ids = np.asarray(sid_token_ids, dtype=np.int64)  # [n_items, depth]
        self.n_items, self.depth = ids.shape
        self.vocab_size = vocab_size
        self.block_lo = ids.min(axis=0)  # [depth]
        self.block_hi = ids.max(axis=0) + 1
        node_of = np.zeros((self.n_items, self.depth + 1), dtype=np.int64)  # node id per depth
        children, leaves = [], []
        for t in range(self.depth):
            parent = node_of[:, t]
            keys = parent * (self.block_hi[t] - self.block_lo[t]) + (ids[:, t] - self.block_lo[t])
            uniq, child = np.unique(keys, return_inverse=True)
            node_of[:, t + 1] = child.reshape(-1)
            n_parents = int(parent.max()) + 1
            table = np.full((n_parents, int(self.block_hi[t] - self.block_lo[t])), -1, dtype=np.int64)
            table[parent, ids[:, t] - self.block_lo[t]] = node_of[:, t + 1]
            children.append(torch.from_numpy(table))
            leaves.append(torch.from_numpy(np.bincount(node_of[:, t + 1], minlength=len(uniq))))
        self._children = children  # per depth: [n_parents_t, width_t] -> child id or -1
        self._leaf_counts = leaves  # per depth: [n_nodes_{t+1}] items under each child node
        self._node_of = torch.from_numpy(node_of)  # [n_items, depth+1]
        self._tok_lo = torch.from_numpy(self.block_lo)

    @property
    def device(self):
        return self._node_of.device

    def to(self, device) -> "PrefixTrie":
        """This trie with its tables on `device` (a copy; self where they are there already)."""
        import copy

        import torch

        if self.device == torch.device(device):
            return self
        out = copy.copy(self)
        out._children = [c.to(device) for c in self._children]
        out._leaf_counts = [c.to(device) for c in self._leaf_counts]
        out._node_of, out._tok_lo = self._node_of.to(device), self._tok_lo.to(device)
        return out

    def walk(self, prefixes):
        """Node ids (depth = prefixes.shape[1]) for a [B, t] LongTensor of SID tokens; -1 if invalid."""
        import torch

        b, t = prefixes.shape
        node = torch.zeros(b, dtype=torch.long, device=self.device)
        for d in range(t):
            col = prefixes[:, d] - int(self.block_lo[d])
            table = self._children[d]
            ok = (node >= 0) & (col >= 0) & (col < table.shape[1])
            nxt = table[node.clamp(min=0), col.clamp(0, table.shape[1] - 1)]  # read where ok, dropped elsewhere
            node = torch.where(ok, nxt, -1)
        return node

    def banned_counts(self, banned: Sequence[Sequence[int]], depth: int):
        """[B, n_nodes_at(depth+1)] number of banned items under each child node at `depth`."""
        import torch

        n_nodes = self._leaf_counts[depth].shape[0]
        banned = [sorted({int(x) for x in b}) for b in banned]  # an item listed twice is banned once
        dev = self.device
        out = torch.zeros(len(banned), n_nodes, dtype=torch.long, device=dev)
        rows = [torch.full((len(b),), i, dtype=torch.long) for i, b in enumerate(banned)]
        if rows and sum(len(b) for b in banned):
            row = torch.cat(rows).to(dev)
            items = torch.as_tensor([int(x) for b in banned for x in b], dtype=torch.long, device=dev)
            out.index_put_((row, self._node_of[items, depth + 1]), torch.ones_like(row), accumulate=True)
        return out

    def allowed_mask(self, prefixes, banned: Sequence[Sequence[int]] | None = None, banned_counts=None,
                     vocab_size: int | None = None):
        """Allowed next tokens for a batch of partial SIDs.

        prefixes: [B, t] LongTensor of SID tokens generated so far (t < depth), on this trie's device.
        banned: per row, item indices that must not be completed (or pass `banned_counts`
        from `banned_counts(...)` precomputed per request and gathered per row).
        vocab_size: the mask's width where the model's vocabulary is padded beyond the layout's tokens (default:
        the layout's vocabulary). Returns a [B, vocab_size] BoolTensor on this trie's device.
        """
        import torch

        b, t = prefixes.shape
        if t >= self.depth:
            raise ValueError(f"prefix length {t} >= SID depth {self.depth}: the SID is complete")
        node = self.walk(prefixes)  # [B]
        table = self._children[t]
        kids = torch.where((node >= 0)[:, None], table[node.clamp(min=0)], -1)  # [B, width]: child id or -1
        ok = kids >= 0  # [B, width]
        if banned is not None or banned_counts is not None:
            if banned_counts is None:
                banned_counts = self.banned_counts(banned, t)
            leaves = self._leaf_counts[t]
            safe = kids.clamp(min=0)
            remaining = leaves[safe] - torch.gather(banned_counts, 1, safe)
            ok &= remaining > 0
        mask = torch.zeros(b, max(self.vocab_size, vocab_size or 0), dtype=torch.bool, device=self.device)
        lo = int(self.block_lo[t])
        mask[:, lo : lo + table.shape[1]] = ok
        return mask
