"""`user_sid`: the user as tokens: the user quantizer's codes U of the user vector, then the recent SIDs.

    <|usid|> U <|hist|> S(h[-k]) ... S(h[-1])

The user vector comes from `user_signal.source` (study/user_signal.py), computed from the history before the k
items the prompt shows (prompts.py: `signal_cut`; `user_signal.history: all`, the whole history; in training from the
items before the window, windows.py), so no target is among the interactions that produced it; U are its codes
under the user quantizer fitted on that source's vectors.
"""

from __future__ import annotations

from workbench.study.methods.base import USER_SIDS, Method, PromptError
from workbench.study.methods.registry import register


class UserSid(Method):
    def head(self, vocab, signal):
        if signal is None:
            raise PromptError("user_sid prompts and windows need the user's SID tokens (the user quantizer's codes)")
        return [vocab.USID, *[int(t) for t in signal], vocab.HIST], None


METHOD = register(UserSid("user_sid", "<|usid|> U(h[:-k]) <|hist|> S(h[-k:])", signal=USER_SIDS))
