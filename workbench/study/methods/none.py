"""`none`: no user signal; the prompt is the SIDs of the user's k most recent items (k = `methods.recent_k`).

    <|hist|> S(h[-k]) ... S(h[-1])

The reference every row of a study is compared with (`compare.REFERENCES`): what the recent history gives alone.
"""

from __future__ import annotations

from workbench.study.methods.base import Method
from workbench.study.methods.registry import register

METHOD = register(Method("none", "<|hist|> S(h[-k:])"))
