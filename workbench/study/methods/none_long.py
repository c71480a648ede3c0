"""`none_long`: no user signal; the SIDs of the user's M most recent items (M = `methods.long_m` >= k).

    <|hist|> S(h[-M]) ... S(h[-1])

What a longer history in the prompt gives, at the prompt length it costs (the user signal's rival).
"""

from __future__ import annotations

from workbench.study.methods.base import Method
from workbench.study.methods.registry import register

METHOD = register(Method("none_long", "<|hist|> S(h[-M:])", context="long_m"))
