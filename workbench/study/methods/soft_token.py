"""`soft_token`: the user as one embedding: the `<|user|>` placeholder, then the recent SIDs.

    <|user|> <|hist|> S(h[-k]) ... S(h[-1])      (placeholder at position 0)

The engine replaces the placeholder's embedding with `projector(user vector)` (Embedding-to-Prefix); the
projector trains with the backbone (train.py) and ships in the checkpoint. The vector comes from
`user_signal.source` (study/user_signal.py), computed from the history before the k items the prompt shows (or the
whole history, `user_signal.history: all`), like user_sid's codes.
"""

from __future__ import annotations

from workbench.study.methods.base import VECTOR, Method
from workbench.study.methods.registry import register


class SoftToken(Method):
    def head(self, vocab, signal):
        return [vocab.USER, vocab.HIST], 0


METHOD = register(SoftToken("soft_token", "<|user|> <|hist|> S(h[-k:])  (vector folded in from h[:-k])",
                            signal=VECTOR))
