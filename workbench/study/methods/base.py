"""The contract of a personalization method: how a prompt tells the model who the user is.

A method is one frozen `Method` (or a subclass) that its own module registers by name (`registry.py`). It
declares what the generic code needs to know, and builds its own tokens:

- `context`: how many history items its prompt shows: the `methods.recent_k` or `methods.long_m` knob, or a
  fixed count (a context variant, `none-k5`, is its method at a fixed count: `variants.py`);
- `signal`: what it reads about the user besides the history: `NONE`; `USER_SIDS`, the user quantizer's codes
  of the user vector written as tokens; or `VECTOR`, the user vector itself, projected into the `<|user|>`
  position (the checkpoint then carries a projector);
- `needs_text`: whether it reads item text (the stage then tokenizes the catalog's text for it);
- `layout`: its prompt in one line (stored in the checkpoint as `prompt_template`);
- `prompt(vocab, history, signal)`: the evaluation prompt of a history, `(ids, placeholder position or None)`;
- `window(vocab, items, signal)`: one training window over items w_0 .. w_m, whose last target's view is
  exactly `prompt(items[:-1])` followed by its SID (`windows.py` explains the windows);
- `engine_prompt(ids, placeholder_pos, user_vector)`: what evaluation and the load test send an engine.

The default prompt and window are a SID stream after the method's `head` tokens (`<|hist|> S(h_0) S(h_1) ...`),
so a SID method declares only its head; a method of another shape overrides `prompt`, `window` and
`longest_view` (text_history.py). The generic code computes the signal from its kind (prompts.py, windows.py)
and never compares method names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, Sequence

import numpy as np

from workbench import names

NONE, USER_SIDS, VECTOR = "none", "user_sids", "vector"  # the kinds of user signal
SIGNALS = (NONE, USER_SIDS, VECTOR)
CONTEXTS = ("recent_k", "long_m")  # the config knobs a method's context length may follow


class PromptError(ValueError):
    """A prompt that cannot be built (unknown method, missing text/user SIDs, over the model's length)."""


class Vocab(Protocol):
    """What a method builds its tokens from (a `prompts.PromptBuilder` is one): the layout's marker ids, every
    item's SID token ids and text token ids, and the history lengths."""

    HIST: int
    TEXT: int
    USID: int
    NEXT: int
    SEP: int
    USER: int  # the `<|user|>` placeholder
    item_sid_ids: np.ndarray  # [n_items, depth]
    item_text_ids: Sequence[Sequence[int]] | None
    recent_k: int
    long_m: int
    max_prompt_tokens: int

    def sids(self, items: Sequence[int]) -> list[int]: ...


@dataclass(frozen=True)
class WindowTokens:
    """One training window's tokens: ids, where the loss is read (logits at `loss_pos` predict `loss_tok`), and
    optionally positions and blocks (per token: -1 the shared stream, b >= 0 visible only within block b)."""

    ids: list[int]
    loss_pos: list[int]
    loss_tok: list[int]
    positions: list[int] | None = None  # None: 0 .. len-1
    blocks: list[int] | None = None  # None: plain causal
    placeholder_pos: int | None = None


@dataclass(frozen=True)
class Method:
    """A personalization method (see the module docstring); subclasses override the token builders."""

    name: str
    layout: str  # the prompt in one line, e.g. "<|hist|> S(h[-k:])"
    context: Literal["recent_k", "long_m"] | int = "recent_k"
    signal: Literal["none", "user_sids", "vector"] = NONE
    needs_text: bool = False

    def __post_init__(self) -> None:
        base, items = names.split_context_variant(self.name)
        if not base.isidentifier():
            raise ValueError(f"a method name is a Python identifier (its module's name), got {self.name!r}")
        if items is not None and self.context != items:  # a context variant (variants.py) shows what its name says
            raise ValueError(f"method {self.name}: a context variant's name says {items} items, its context is "
                             f"{self.context!r}")
        if self.signal not in SIGNALS:
            raise ValueError(f"method {self.name}: signal {self.signal!r} is not one of {SIGNALS}")
        if not (self.context in CONTEXTS or (isinstance(self.context, int) and self.context >= 1)):
            raise ValueError(f"method {self.name}: context {self.context!r} is not one of {CONTEXTS} or a count >= 1")

    @property
    def reads_signal(self) -> bool:
        return self.signal != NONE

    def context_items(self, recent_k: int, long_m: int) -> int:
        """How many history items the prompt shows (and a training window's targets see at most)."""
        if isinstance(self.context, int):
            return self.context
        return long_m if self.context == "long_m" else recent_k

    # ---- tokens ----------------------------------------------------------------------------------
    def head(self, vocab: Vocab, signal) -> tuple[list[int], int | None]:
        """The tokens before the SID stream and the placeholder's position in them (None: no placeholder)."""
        return [vocab.HIST], None

    def prompt(self, vocab: Vocab, history: Sequence[int], signal) -> tuple[list[int], int | None]:
        """The evaluation prompt of `history` (oldest first): the head, then the SIDs of the last context items."""
        head, pos = self.head(vocab, signal)
        n = self.context_items(vocab.recent_k, vocab.long_m)
        return head + vocab.sids(list(history)[-n:] if n else []), pos

    def window(self, vocab: Vocab, items: np.ndarray, signal) -> WindowTokens:
        """The head, then S(w_0) S(w_1) ... S(w_m); the loss on every SID token of w_1 .. w_m."""
        head, pos = self.head(vocab, signal)
        ids = head + vocab.item_sid_ids[items].reshape(-1).tolist()  # [len(head) + (m + 1) x depth]
        first = len(head) + vocab.item_sid_ids.shape[1]  # first token of S(w_1)
        return WindowTokens(ids, list(range(first - 1, len(ids) - 1)), ids[first:], placeholder_pos=pos)

    def longest_view(self, vocab: Vocab, shown: np.ndarray) -> int | None:
        """Tokens of the longest view (prompt + target SID) in a window whose context items are `shown`, when a
        window may have to be cut shorter to fit the model; None: its length is bounded by the context alone."""
        return None

    def engine_prompt(self, ids: Sequence[int], placeholder_pos: int | None, user_vector: np.ndarray | None):
        """What an engine is sent for one prompt (evaluation and the `test_split` load test alike)."""
        from workbench.engines.base import Prompt

        return Prompt.of(ids, user_vector=user_vector, placeholder_pos=placeholder_pos)
