"""Context variants: one method at several prompt lengths in one study, each its own trained model.

Why: the question "how many prompt tokens does a user signal save at equal quality" needs `none` and
`text_history` at several contexts (and the signal methods at short ones) side by side, measured like every
other row. A study lists them as `methods.contexts: {none: [5, 10, 20, 50], soft_token: [5]}`; each
(method, items) is then the method with a fixed context (`Method.context = items`), named
`names.context_variant(method, items)` (`none-k5`: the one spelling, names.py), trained, cached, evaluated,
tabled and logged as any method is. `methods.get("none-k5")` derives it from the registered `none` (nothing is
registered), so a checkpoint's stored method name, `--methods none-k5` and `trained:none-k5` resolve too.

- A variant at its method's own context in this config is the method itself (`rows.canonical`): `none` at
  `methods.recent_k` items is `none`, one model, its cache key unchanged.
- A variant's train cache key is its method's key with its context added (`inputs.train_key`).
- Each row is also compared with `none` at the same number of items where the study has it
  (`rows.same_context_references`; the table's `vs_none_at_context` columns): soft_token at 5 items vs `none-k5`.
"""

from __future__ import annotations

import dataclasses

from workbench import names
from workbench.study.methods.base import Method

REFERENCE = "none"  # the family every row is compared with at its own context


def variant(method: Method, items: int) -> Method:
    """`method` showing its `items` most recent history items, named `names.context_variant(method.name, items)`."""
    if isinstance(items, bool) or not isinstance(items, int) or items < 1:
        raise ValueError(f"a context is a number of history items >= 1, got {items!r} for method {method.name}")
    return dataclasses.replace(method, name=names.context_variant(method.name, items), context=items,
                               layout=f"{method.layout}, the last {items} items")


def family(name: str) -> str:
    """The method a row belongs to across its contexts: "none-k5" -> "none", "soft_token-k5/shuffled" ->
    "soft_token"; any other name (a method, a baseline) is its own."""
    return names.split_context_variant(name.split("/")[0])[0]
