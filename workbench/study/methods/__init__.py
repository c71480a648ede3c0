"""One home per personalization method: `base.py` is the contract, `registry.py` the names, and each built-in
(none, none_long, text_history, user_sid, soft_token: `names.METHODS`, in that order) one module that declares
its prompt layout, training windows, user signal and engine prompts, and registers itself. `variants.py`: a
method at other contexts (`none-k5`), derived by `get`.

    from workbench.study import methods
    methods.get("user_sid").signal      # "user_sids"
"""

from __future__ import annotations

import importlib

from workbench import names as _names
from workbench.study.methods.base import NONE, SIGNALS, USER_SIDS, VECTOR, Method, PromptError, Vocab, WindowTokens
from workbench.study.methods.registry import UnknownMethod, get, names, reading_signal, register, unregister
from workbench.study.methods.rows import canonical, same_context_references, study_methods
from workbench.study.methods.variants import family

for _name in _names.METHODS:  # each module registers itself on import; the table order is this order
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["NONE", "SIGNALS", "USER_SIDS", "VECTOR", "Method", "PromptError", "UnknownMethod", "Vocab",
           "WindowTokens", "canonical", "family", "get", "names", "reading_signal", "register",
           "same_context_references", "study_methods", "unregister"]
