"""Prompt builders for the personalization methods, and the examples they are trained and tested on.

Every prompt is a list of token ids (the engines speak ids only), after which the model writes
the target item's SID. Each method's own module (`study/methods/`) lays its prompt out; this module is
generic: it computes the user signal the method asks for and hands it to the method. With `S(i)` the SID
tokens of item i, `T(i)` the tokenized text of item i ("Toy Story (1995) — Animation, Comedy"), `h` the
user's history (oldest first), `k = methods.recent_k`, `M = methods.long_m`, the built-ins are:

    none          <|hist|> S(h[-k]) ... S(h[-1])
    none_long     <|hist|> S(h[-M]) ... S(h[-1])
    text_history  <|text|> T(h[-M]) <|sep|> ... <|sep|> T(h[-1]) <|next|>
    user_sid      <|usid|> U <|hist|> S(h[-k]) ... S(h[-1])
    soft_token    <|user|> <|hist|> S(h[-k]) ... S(h[-1])      (placeholder at position 0)

These are the views the full-sequence training windows give their last target (`windows.py`): a
SID history is a plain stream in which each SID follows the previous one, so a SID prompt needs no
end marker. A method's user signal is one of three kinds (`methods.SIGNALS`): none; user SIDs `U`, the
user-SID tokens of the user's vector; or the vector itself, which replaces the `<|user|>` embedding
(projected: Embedding-to-Prefix). The vector comes from the study's user-signal source (`user_signal.source`:
an ALS fold-in, the dataset's user features or user embeddings, a SASRec's user state; `study/user_signal.py`),
computed from the history *before* the items the prompt shows (`user_signal.history: older`, the default) or from
the whole history before the prompt (`all`): `signal_cut`. When a text history would exceed `max_prompt_tokens`,
whole items are dropped from its oldest end.

Leakage rule: an example whose target is position t of a user's sequence sees only items before t,
in the prompt and in the user vector (computed from items before t only, by a model that never saw this
user where the source is learned from interactions). Validation sees the train sequence; test sees train + valid. The `seen` items of an example (everything before t) are the
ones evaluation bans in the trie for every method and baseline.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from workbench.sids.layout import SidLayout
from workbench.study import methods
from workbench.study.methods import PromptError

SIGNAL_VARIANTS = ("own", "shuffled", "zeroed")  # what evaluation feeds a method that reads a user signal
HISTORIES = ("older", "all")  # which interactions a user vector is computed from (`user_signal.history`)


@dataclass
class UserEncoder:
    """User vectors "as of" a point of each user's history (a user-signal source, `study/user_signal.py`) and
    their user-SID codes.

    `vectors(users, item_lists, as_of) -> [n, dim]`: user `users[i]`'s vector from the interactions `item_lists[i]`
    only, `as_of[i]` being the timestamp of the last of them (-1: none, or not known), for a source that looks
    vectors up by time; `codes(vectors) -> [n, levels]` is the user quantizer's encode (None when there are no
    user SIDs); `train_vectors(user, seq, cuts) -> [len(cuts), dim]`: the training windows' vectors as of
    `seq[:c]` (seq: the user's train sequence), from models that never saw this user where the source is
    learned from interactions (the ALS / SASRec fold models); `history`: which interactions they read
    (`signal_cut`, `window_signal_cut`).
    """

    vectors: Callable[[np.ndarray, Sequence[Sequence[int]], np.ndarray], np.ndarray]
    dim: int
    codes: Callable[[np.ndarray], np.ndarray] | None = None
    train_vectors: Callable[[int, np.ndarray, np.ndarray], np.ndarray] | None = None
    history: str = "older"

    def __post_init__(self):
        if self.history not in HISTORIES:
            raise ValueError(f"UserEncoder.history must be one of {HISTORIES}, got {self.history!r}")


def signal_cut(n: int, shown: int, history: str = "older") -> int:
    """How many of a prompt's n history items (oldest first) its user vector is computed from: `older`, those
    before the `shown` items the prompt shows; `all`, every one (everything before the prompt)."""
    return max(0, n - shown) if history == "older" else n


def window_signal_cut(start: int, history: str = "older") -> int:
    """How many items of a user's train sequence a training window over seq[start:] reads its user vector from:
    `older`, seq[:start] (before w_0, as a prompt's older part ends before the items it shows); `all`,
    seq[:start + 1] (up to w_0: everything before the window's first target). Never a target of the window
    (w_1 ..). With `all` a window's later targets see a vector a few items older than a prompt would."""
    return start if history == "older" else start + 1


@dataclass
class Interactions:
    """Per-user train sequences (time order) plus one valid and one test item per user."""

    train: list[np.ndarray]
    valid: np.ndarray  # [n_users] item index
    test: np.ndarray  # [n_users] item index
    n_items: int
    # timestamps (int seconds) of the same interactions, for sources that look vectors up by time (None: unknown)
    train_times: list[np.ndarray] | None = None
    valid_times: np.ndarray | None = None
    test_times: np.ndarray | None = None

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
    user_vectors: np.ndarray | None  # [n, dim] (methods whose signal is the vector)
    seen: list[np.ndarray] = field(default_factory=list)  # items before the target (banned at evaluation)
    signals: Sequence[Any] | None = None  # per example, the signal the prompt was built from (None: no signal)
    builder: "PromptBuilder | None" = field(default=None, repr=False)  # what built the prompts (signal variants)

    def __len__(self) -> int:
        return len(self.prompts)

    def lengths(self) -> np.ndarray:
        return np.array([len(p) for p in self.prompts], dtype=np.int64)

    def subset(self, idx: Sequence[int]) -> "PromptSet":
        idx = list(idx)
        return dataclasses.replace(
            self,
            users=self.users[idx],
            targets=self.targets[idx],
            prompts=[self.prompts[i] for i in idx],
            placeholder_pos=[self.placeholder_pos[i] for i in idx],
            user_vectors=None if self.user_vectors is None else self.user_vectors[idx],
            seen=[self.seen[i] for i in idx] if self.seen else [],
            signals=None if self.signals is None else [self.signals[i] for i in idx],
        )

    def with_signal(self, variant: str, seed: int = 0, zero_user_sid: Sequence[int] | None = None) -> "PromptSet":
        """The same examples with the user signal replaced, to measure what it carries: "own" (as is),
        "shuffled" (another test user's signal, a fixed random permutation) or "zeroed" (a zero vector; for
        user SIDs the all-zero codes `zero_user_sid`, default the layout's: a valid but uninformative user SID).
        The prompts are built again by the method from each example's history and its new signal."""
        if variant == "own":
            return self
        spec = methods.get(self.method)
        if variant not in SIGNAL_VARIANTS or not spec.reads_signal:
            raise PromptError(f"signal variant {variant!r} applies to the methods that read a user signal "
                              f"({', '.join(methods.reading_signal())}) with one of {SIGNAL_VARIANTS}")
        if self.builder is None or self.signals is None:
            raise PromptError("a signal variant needs the PromptSet that build_prompts made (its builder and signals)")
        n = len(self)
        perm = np.random.default_rng(seed).permutation(n)
        vectors = None
        if spec.signal == methods.VECTOR:
            vectors = self.user_vectors[perm] if variant == "shuffled" else np.zeros_like(self.user_vectors)
            new = list(vectors)
        else:
            zero = list(zero_user_sid) if zero_user_sid is not None else self.builder.zero_user_sid()
            new = [self.signals[int(j)] for j in perm] if variant == "shuffled" else [zero] * n
        rebuilt = [self.builder.build(self.seen[i], new[i]) for i in range(n)]
        return dataclasses.replace(self, prompts=[ids for ids, _ in rebuilt], placeholder_pos=[p for _, p in rebuilt],
                                   user_vectors=vectors, seen=list(self.seen), signals=new)

    def engine_prompt(self, i: int):
        """The i-th prompt as an engine `Prompt`, as its method sends it (with the user vector where it reads one)."""
        vec = None if self.user_vectors is None else self.user_vectors[i]
        return methods.get(self.method).engine_prompt(self.prompts[i], self.placeholder_pos[i], vec)


class PromptBuilder:
    """Builds one method's prompt from a history (and the user signal where the method reads one); the method
    lays the tokens out (`methods.Method.prompt`), this holds the layout's ids it builds from (`methods.Vocab`)."""

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
        spec = methods.get(method)  # UnknownMethod (a PromptError) names the registered ones
        if spec.needs_text and item_text_ids is None:
            raise PromptError(f"{method} needs item_text_ids (each item's title/year/genres tokenized)")
        if spec.signal == methods.USER_SIDS and not layout.user_codebooks:
            raise PromptError(f"{method} needs a layout with user codebooks (fit the user quantizer)")
        if long_m < recent_k:
            raise PromptError(f"long_m ({long_m}) must be >= recent_k ({recent_k})")
        self.method = method
        self.spec = spec  # the method's Method: its layout, context and signal
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
        return self.spec.layout

    @property
    def context_items(self) -> int:
        """How many history items the method's prompt shows."""
        return self.spec.context_items(self.recent_k, self.long_m)

    def sids(self, items: Sequence[int]) -> list[int]:
        """The SID token ids of `items`, one after the other."""
        if len(items) == 0:
            return []
        return self.item_sid_ids[np.asarray(items, dtype=np.int64)].reshape(-1).tolist()

    def zero_user_sid(self) -> list[int]:
        """The user-SID tokens of the all-zero codes: a valid but uninformative user SID."""
        zeros = np.zeros((1, len(self.layout.user_codebooks)), dtype=np.int64)
        return self.layout.user_codes_to_ids(zeros)[0].tolist()

    def signal_history(self, history: Sequence[int], mode: str = "older") -> list[int]:
        """The items the user signal is computed from (`signal_cut`): with `older`, everything before the items the
        prompt shows; with `all`, the whole history."""
        history = list(history)
        return history[: signal_cut(len(history), self.context_items, mode)]

    def build(self, history: Sequence[int], signal=None) -> tuple[list[int], int | None]:
        """(token ids, placeholder position or None) for a history (oldest first) and the method's signal
        (user-SID token ids or the user vector; None for a method without one)."""
        ids, pos = self.spec.prompt(self, list(history), signal)
        if len(ids) > self.max_prompt_tokens:
            raise PromptError(
                f"{self.method} prompt of {len(ids)} tokens exceeds max_prompt_tokens={self.max_prompt_tokens}; "
                "lower methods.long_m / recent_k or raise model.max_position_embeddings"
            )
        return ids, pos


def user_signals(builder: PromptBuilder, encoder: UserEncoder | None, vectors: np.ndarray | None = None,
                 histories: Sequence[Sequence[int]] | None = None, users: Sequence[int] | None = None,
                 times: Sequence[Sequence[int]] | None = None):
    """The user signal of each example for the builder's method: None (no signal), the vectors [n, dim], or
    the user-SID token ids [n, levels]. `vectors` as given, else computed by the encoder for each user from its
    history's `signal_history` (`times`: the history's timestamps, element for element, where known)."""
    spec = builder.spec
    if not spec.reads_signal:
        return None
    if vectors is None:
        if encoder is None:
            raise PromptError(f"{builder.method} needs a UserEncoder (the user-signal source) to compute user vectors")
        cuts = [signal_cut(len(h), builder.context_items, encoder.history) for h in histories]
        as_of = np.array([int(t[c - 1]) if t is not None and c > 0 else -1
                          for t, c in zip(times if times is not None else [None] * len(cuts), cuts)], dtype=np.int64)
        users = np.full(len(cuts), -1, dtype=np.int64) if users is None else np.asarray(users, dtype=np.int64)
        vectors = encoder.vectors(users, [list(h)[:c] for h, c in zip(histories, cuts)], as_of)
    vectors = np.asarray(vectors, dtype=np.float32)
    if spec.signal == methods.VECTOR:
        return vectors
    if encoder is None or encoder.codes is None:
        raise PromptError(f"{builder.method} needs the user quantizer (UserEncoder.codes)")
    return builder.layout.user_codes_to_ids(np.asarray(encoder.codes(vectors)))


def build_prompts(
    builder: PromptBuilder,
    users: Sequence[int],
    histories: Sequence[Sequence[int]],
    targets: Sequence[int],
    encoder: UserEncoder | None = None,
    times: Sequence[Sequence[int]] | None = None,
) -> PromptSet:
    """Prompts for (user, history, target) triples; the user signal is computed from the part of each history
    `encoder.history` names (`signal_cut`); `times`: each history's timestamps, where known."""
    signals = user_signals(builder, encoder, histories=histories, users=users, times=times)
    prompts, pos = [], []
    for i, h in enumerate(histories):
        ids, p = builder.build(h, None if signals is None else signals[i])
        prompts.append(ids)
        pos.append(p)
    return PromptSet(
        method=builder.method,
        users=np.asarray(users, dtype=np.int64),
        targets=np.asarray(targets, dtype=np.int64),
        prompts=prompts,
        placeholder_pos=pos,
        user_vectors=signals if builder.spec.signal == methods.VECTOR else None,
        seen=[np.asarray(h, dtype=np.int64) for h in histories],
        signals=None if signals is None else list(signals),
        builder=builder,
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
    timed = data.train_times is not None
    times = None
    if split == "valid":
        hists = [data.train[u] for u in users]
        targets = [int(data.valid[u]) for u in users]
        times = [data.train_times[u] for u in users] if timed else None
    else:
        hists = [np.r_[data.train[u], data.valid[u]].astype(np.int64) for u in users]
        targets = [int(data.test[u]) for u in users]
        times = [np.r_[data.train_times[u], data.valid_times[u]].astype(np.int64) for u in users] if timed else None
    return build_prompts(builder, users, hists, targets, encoder, times)


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
