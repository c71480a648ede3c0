"""Prompt builders for the personalization methods, and the examples they are trained and tested on.

Every prompt is a list of token ids (the engines speak ids only), after which the model writes
the target item's SID. With `S(i)` the SID tokens of item i, `T(i)` the tokenized text of item i
("Toy Story (1995) — Animation, Comedy"), `h` the user's history (oldest first),
`k = methods.recent_k`, `M = methods.long_m`:

    none          <|hist|> S(h[-k]) ... S(h[-1])
    none_long     <|hist|> S(h[-M]) ... S(h[-1])
    text_history  <|text|> T(h[-M]) <|sep|> ... <|sep|> T(h[-1]) <|next|>
    user_sid      <|usid|> U <|hist|> S(h[-k]) ... S(h[-1])
    soft_token    <|user|> <|hist|> S(h[-k]) ... S(h[-1])      (placeholder at position 0)

These are the views the full-sequence training windows give their last target (`windows.py`): a
SID history is a plain stream in which each SID follows the previous one, so a SID prompt needs no
end marker. `U` are the user-SID tokens of the user's vector, and the `<|user|>` embedding is
replaced by the projected user vector (Embedding-to-Prefix); both are folded in from the history
*before* the k items the prompt shows (`signal_history`), as in training. When a text history
would exceed `max_prompt_tokens`, whole items are dropped from its oldest end.

Leakage rule: an example whose target is position t of a user's sequence sees only items before t,
in the prompt and in the user vector (fold-in, item factors fixed). Validation sees the train
sequence; test sees train + valid. The `seen` items of an example (everything before t) are the
ones evaluation bans in the trie for every method and baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from workbench.names import METHODS
from workbench.sids.layout import SidLayout

NEEDS_VECTOR = ("user_sid", "soft_token")  # methods that fold the user in
SIGNAL_VARIANTS = ("own", "shuffled", "zeroed")  # what evaluation feeds a method that reads a user signal

TEMPLATES = {
    "none": "<|hist|> S(h[-k:])",
    "none_long": "<|hist|> S(h[-M:])",
    "text_history": "<|text|> T(h[-M]) <|sep|> ... T(h[-1]) <|next|>",
    "user_sid": "<|usid|> U(h[:-k]) <|hist|> S(h[-k:])",
    "soft_token": "<|user|> <|hist|> S(h[-k:])  (vector folded in from h[:-k])",
}


class PromptError(ValueError):
    """A prompt that cannot be built (missing text/user SIDs, over the model's length)."""


@dataclass
class UserEncoder:
    """User vectors "as of" an item list (fold-in) and their user-SID codes.

    `vectors(item_lists) -> [n, dim]` must use only the items given (serving: the full-train ALS);
    `codes(vectors) -> [n, levels]` is the user quantizer's encode (None when there are no user
    SIDs); `train_vectors(user, seq, cuts) -> [len(cuts), dim]` folds `seq[:c]` in with item
    factors that never saw this user (the ALS fold models), for training windows.
    """

    vectors: Callable[[Sequence[Sequence[int]]], np.ndarray]
    dim: int
    codes: Callable[[np.ndarray], np.ndarray] | None = None
    train_vectors: Callable[[int, np.ndarray, np.ndarray], np.ndarray] | None = None


@dataclass
class Interactions:
    """Per-user train sequences (time order) plus one valid and one test item per user."""

    train: list[np.ndarray]
    valid: np.ndarray  # [n_users] item index
    test: np.ndarray  # [n_users] item index
    n_items: int

    @property
    def n_users(self) -> int:
        return len(self.train)


@dataclass
class PromptSet:
    """Prompts of one method for a set of (user, target) examples, column-oriented."""

    method: str
    users: np.ndarray  # [n] user index
    targets: np.ndarray  # [n] target item index
    prompts: list[list[int]]  # token ids, ending in <|next|>
    placeholder_pos: list[int | None]
    user_vectors: np.ndarray | None  # [n, dim] (soft_token only)
    seen: list[np.ndarray] = field(default_factory=list)  # items before the target (banned at evaluation)

    def __len__(self) -> int:
        return len(self.prompts)

    def lengths(self) -> np.ndarray:
        return np.array([len(p) for p in self.prompts], dtype=np.int64)

    def subset(self, idx: Sequence[int]) -> "PromptSet":
        idx = list(idx)
        return PromptSet(
            method=self.method,
            users=self.users[idx],
            targets=self.targets[idx],
            prompts=[self.prompts[i] for i in idx],
            placeholder_pos=[self.placeholder_pos[i] for i in idx],
            user_vectors=None if self.user_vectors is None else self.user_vectors[idx],
            seen=[self.seen[i] for i in idx] if self.seen else [],
        )

    def with_signal(self, variant: str, seed: int = 0, zero_user_sid: Sequence[int] | None = None) -> "PromptSet":
        """The same prompts with the user signal replaced, to measure what it carries: "own" (as is),
        "shuffled" (another test user's signal, a fixed random permutation) or "zeroed" (a zero vector;
        for user_sid the all-zero codes `zero_user_sid`, a valid but uninformative user SID)."""
        if variant == "own":
            return self
        if variant not in SIGNAL_VARIANTS or self.method not in NEEDS_VECTOR:
            raise PromptError(f"signal variant {variant!r} applies to {NEEDS_VECTOR} with one of {SIGNAL_VARIANTS}")
        n = len(self)
        perm = np.random.default_rng(seed).permutation(n)
        out = PromptSet(self.method, self.users, self.targets, [list(p) for p in self.prompts],
                        list(self.placeholder_pos), self.user_vectors, list(self.seen))
        if self.method == "soft_token":
            v = self.user_vectors
            out.user_vectors = v[perm] if variant == "shuffled" else np.zeros_like(v)
            return out
        if zero_user_sid is None:
            raise PromptError("a user_sid signal variant needs zero_user_sid (the layout's code-0 user tokens)")
        span = slice(1, 1 + len(zero_user_sid))  # <|usid|> U ... : U follows the marker
        for i in range(n):
            out.prompts[i][span] = self.prompts[perm[i]][span] if variant == "shuffled" else list(zero_user_sid)
        return out

    def engine_prompt(self, i: int):
        """The i-th prompt as an engine `Prompt` (with the user vector for soft_token)."""
        from workbench.engines.base import Prompt

        vec = None if self.user_vectors is None else self.user_vectors[i]
        return Prompt.of(self.prompts[i], user_vector=vec, placeholder_pos=self.placeholder_pos[i])


class PromptBuilder:
    """Builds one method's prompt from a history (and user SID tokens where the method needs them)."""

    def __init__(
        self,
        method: str,
        layout: SidLayout,
        item_sid_ids: np.ndarray,
        recent_k: int,
        long_m: int,
        item_text_ids: Sequence[Sequence[int]] | None = None,
        max_prompt_tokens: int = 1024,
    ):
        if method not in METHODS:
            raise PromptError(f"unknown method {method!r}; choose one of {METHODS}")
        if method == "text_history" and item_text_ids is None:
            raise PromptError("text_history needs item_text_ids (each item's title/year/genres tokenized)")
        if method == "user_sid" and not layout.user_codebooks:
            raise PromptError("user_sid needs a layout with user codebooks (fit the user quantizer)")
        if long_m < recent_k:
            raise PromptError(f"long_m ({long_m}) must be >= recent_k ({recent_k})")
        self.method = method
        self.layout = layout
        self.item_sid_ids = np.asarray(item_sid_ids, dtype=np.int64)  # [n_items, depth]
        self.recent_k = recent_k
        self.long_m = long_m
        self.item_text_ids = item_text_ids
        self.max_prompt_tokens = max_prompt_tokens
        sp = layout.special_id
        self.HIST, self.TEXT, self.USID, self.NEXT, self.SEP = (
            sp("<|hist|>"), sp("<|text|>"), sp("<|usid|>"), sp("<|next|>"), sp("<|sep|>"),
        )  # fmt: skip
        self.USER = layout.placeholder_id

    @property
    def template(self) -> str:
        return TEMPLATES[self.method]

    def _sids(self, items: Sequence[int]) -> list[int]:
        if len(items) == 0:
            return []
        return self.item_sid_ids[np.asarray(items, dtype=np.int64)].reshape(-1).tolist()

    def _text(self, items: Sequence[int], budget: int) -> list[int]:
        """`<|text|> T(a) <|sep|> T(b) ...` within `budget` tokens, dropping the oldest items first."""
        pieces: list[list[int]] = []
        used = 1  # <|text|>
        for it in reversed(list(items)):  # newest first, so truncation drops the oldest
            piece = list(self.item_text_ids[int(it)])
            extra = len(piece) + (1 if pieces else 0)
            if used + extra > budget:
                break
            pieces.append(piece)
            used += extra
        out = [self.TEXT]
        for j, piece in enumerate(reversed(pieces)):
            if j:
                out.append(self.SEP)
            out += piece
        return out

    def signal_history(self, history: Sequence[int]) -> list[int]:
        """The items the user signal is folded in from: everything before the k items the prompt shows."""
        history = list(history)
        return history[: max(0, len(history) - self.recent_k)]

    def build(self, history: Sequence[int], user_sid_ids: Sequence[int] | None = None) -> tuple[list[int], int | None]:
        """(token ids, placeholder position or None) for a history (oldest first)."""
        history = list(history)
        tail = [self.HIST, *self._sids(history[-self.recent_k :])] if self.recent_k else [self.HIST]
        m = self.method
        if m == "none":
            ids, pos = tail, None
        elif m == "none_long":
            ids, pos = [self.HIST, *self._sids(history[-self.long_m :])], None
        elif m == "text_history":
            ids, pos = self._text(history[-self.long_m :], self.max_prompt_tokens - 1) + [self.NEXT], None
        elif m == "user_sid":
            if user_sid_ids is None:
                raise PromptError("user_sid prompts need the user's SID tokens")
            ids, pos = [self.USID, *[int(t) for t in user_sid_ids], *tail], None
        else:  # soft_token
            ids, pos = [self.USER, *tail], 0
        if len(ids) > self.max_prompt_tokens:
            raise PromptError(
                f"{m} prompt of {len(ids)} tokens exceeds max_prompt_tokens={self.max_prompt_tokens}; "
                "lower methods.long_m / recent_k or raise model.max_position_embeddings"
            )
        return ids, pos


def build_prompts(
    builder: PromptBuilder,
    users: Sequence[int],
    histories: Sequence[Sequence[int]],
    targets: Sequence[int],
    encoder: UserEncoder | None = None,
) -> PromptSet:
    """Prompts for (user, history, target) triples; the user signal is folded in from the part of each
    history before the items its prompt shows (`PromptBuilder.signal_history`)."""
    method = builder.method
    vectors = None
    usid = None
    if method in NEEDS_VECTOR:
        if encoder is None:
            raise PromptError(f"{method} needs a UserEncoder (ALS fold-in) to compute user vectors")
        vectors = np.asarray(encoder.vectors([builder.signal_history(h) for h in histories]), dtype=np.float32)
        if method == "user_sid":
            if encoder.codes is None:
                raise PromptError("user_sid needs the user quantizer (UserEncoder.codes)")
            usid = builder.layout.user_codes_to_ids(np.asarray(encoder.codes(vectors)))
    prompts, pos = [], []
    for i, h in enumerate(histories):
        ids, p = builder.build(h, None if usid is None else usid[i])
        prompts.append(ids)
        pos.append(p)
    return PromptSet(
        method=method,
        users=np.asarray(users, dtype=np.int64),
        targets=np.asarray(targets, dtype=np.int64),
        prompts=prompts,
        placeholder_pos=pos,
        user_vectors=vectors if method == "soft_token" else None,
        seen=[np.asarray(h, dtype=np.int64) for h in histories],
    )


def eval_examples(
    builder: PromptBuilder,
    data: Interactions,
    split: str,
    encoder: UserEncoder | None = None,
    users: Sequence[int] | None = None,
) -> PromptSet:
    """Validation (history = train) or test (history = train + valid) prompts for `users` (default all)."""
    if split not in ("valid", "test"):
        raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
    users = list(range(data.n_users)) if users is None else [int(u) for u in users]
    if split == "valid":
        hists = [data.train[u] for u in users]
        targets = [int(data.valid[u]) for u in users]
    else:
        hists = [np.r_[data.train[u], data.valid[u]].astype(np.int64) for u in users]
        targets = [int(data.test[u]) for u in users]
    return build_prompts(builder, users, hists, targets, encoder)


def tokenize_item_texts(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each item's text (no special tokens), computed once per catalog.

    Item text is data, not template: `split_special_tokens=True` reads a literal "<|user|>" or "<|sep|>"
    in a title as characters, so catalog text can never inject a placeholder or a structural token
    (the builders write those as ids). Text without such literals gets the same ids either way.
    """
    enc = tokenizer(list(texts), add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return [list(map(int, x)) for x in enc]


def length_stats(ps: PromptSet) -> dict[str, float]:
    from workbench import names

    lens = ps.lengths()
    return {names.PROMPT_TOKENS_MEAN: float(lens.mean()), names.PROMPT_TOKENS_P95: float(np.percentile(lens, 95))}
