"""`text_history`: the user's M most recent items as text (titles, year, genres), then the SID to write.

    <|text|> T(h[-M]) <|sep|> ... <|sep|> T(h[-1]) <|next|>

When the text would exceed `max_prompt_tokens`, whole items are dropped from its oldest end. Training windows
share one text stream: `<|text|> T(w_0) [<|next|> S(w_1)] <|sep|> T(w_1) [<|next|> S(w_2)] ...`, where each
`[<|next|> S(w_j)]` block is seen only by itself (the multi-item scoring mask) and takes the positions it would
have at the end of its own prompt `<|text|> T(w_0) ... T(w_{j-1}) <|next|>`; so one pass gives every target
the loss of its own per-example prompt (tests/test_windows.py checks that to 1e-5). A window whose longest
prompt would not fit is cut shorter (`longest_view`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from workbench.study.methods.base import Method, WindowTokens
from workbench.study.methods.registry import register


class TextHistory(Method):
    def prompt(self, vocab, history, signal):
        n = self.context_items(vocab.recent_k, vocab.long_m)
        return text(vocab, list(history)[-n:], vocab.max_prompt_tokens - 1) + [vocab.NEXT], None

    def window(self, vocab, items: np.ndarray, signal) -> WindowTokens:
        depth = vocab.item_sid_ids.shape[1]
        ids, pos, blocks, loss_pos, loss_tok = [vocab.TEXT], [0], [-1], [], []
        for j, it in enumerate(items):
            if j:  # the block of target w_j: positions as at the end of its own prompt
                base = pos[-1] + 1
                sid = vocab.item_sid_ids[int(it)].tolist()
                at = len(ids)
                ids += [vocab.NEXT, *sid]
                pos += list(range(base, base + 1 + depth))
                blocks += [j] * (1 + depth)
                loss_pos += list(range(at, at + depth))
                loss_tok += sid
            if j < len(items) - 1:  # T(w_j) is context for the later targets
                piece = ([vocab.SEP] if j else []) + list(vocab.item_text_ids[int(it)])
                base = pos[-1] + 1 if j == 0 else pos[_last_shared(blocks)] + 1
                ids += piece
                pos += list(range(base, base + len(piece)))
                blocks += [-1] * len(piece)
        return WindowTokens(ids, loss_pos, loss_tok, positions=pos, blocks=blocks)

    def longest_view(self, vocab, shown: np.ndarray) -> int:
        """The last target's prompt and SID: <|text|>, each shown item's text with its <|sep|> / <|next|>, S."""
        texts = sum(len(vocab.item_text_ids[int(i)]) + 1 for i in shown)
        return 1 + texts + vocab.item_sid_ids.shape[1]


def text(vocab, items: Sequence[int], budget: int) -> list[int]:
    """`<|text|> T(a) <|sep|> T(b) ...` within `budget` tokens, dropping the oldest items first."""
    pieces: list[list[int]] = []
    used = 1  # <|text|>
    for it in reversed(list(items)):  # newest first, so truncation drops the oldest
        piece = list(vocab.item_text_ids[int(it)])
        extra = len(piece) + (1 if pieces else 0)
        if used + extra > budget:
            break
        pieces.append(piece)
        used += extra
    out = [vocab.TEXT]
    for j, piece in enumerate(reversed(pieces)):
        if j:
            out.append(vocab.SEP)
        out += piece
    return out


def _last_shared(blocks: list[int]) -> int:
    """Index of the last token of the shared stream (the text before the newest block)."""
    i = len(blocks) - 1
    while blocks[i] != -1:
        i -= 1
    return i


METHOD = register(TextHistory("text_history", "<|text|> T(h[-M]) <|sep|> ... T(h[-1]) <|next|>", context="long_m",
                              needs_text=True))
