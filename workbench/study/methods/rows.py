"""The rows a study tables: its methods' canonical names, in table order, and each row's same-context `none`.

Here rather than in variants.py because these look methods up in the registry, which itself derives the
variants (variants.py): the registry sits between the two.
"""

from __future__ import annotations

from workbench import names
from workbench.study.methods.registry import UnknownMethod, get
from workbench.study.methods.variants import REFERENCE, family


def canonical(name: str, recent_k: int, long_m: int) -> str:
    """The name a study uses for `name`: a variant at its method's own context (in this config) is the method."""
    base, items = names.split_context_variant(name)
    if items is not None and get(base).context_items(recent_k, long_m) == items:
        return base
    return name


def study_methods(mc) -> tuple[str, ...]:
    """The methods a study trains and evaluates, from its `methods` section: `run` and every `contexts` variant,
    each name canonical, duplicates dropped; in table order: the families as `run` (then `contexts`) first names
    them, each family's rows by context, smallest first."""
    rows = [canonical(m, mc.recent_k, mc.long_m) for m in mc.run]
    rows += [canonical(names.context_variant(base, n), mc.recent_k, mc.long_m)
             for base, contexts in mc.contexts.items() for n in contexts]
    rows = list(dict.fromkeys(rows))
    order = {f: i for i, f in enumerate(dict.fromkeys(family(r) for r in rows))}
    return tuple(sorted(rows, key=lambda r: (order[family(r)], get(r).context_items(mc.recent_k, mc.long_m))))


def context_items(name: str, recent_k: int, long_m: int) -> int | None:
    """How many history items a row's prompt shows; None for a name that is no method (a baseline)."""
    try:
        return get(name).context_items(recent_k, long_m)
    except UnknownMethod:
        return None


def same_context_references(rows, recent_k: int, long_m: int) -> dict[str, str]:
    """{row: the `none` row at the same number of history items} for every method row (not `none`'s own, not a
    signal ablation, not a baseline) whose `none` at that context is among `rows`."""
    nones = {context_items(r, recent_k, long_m): r for r in rows
             if "/" not in r and family(r) == REFERENCE and context_items(r, recent_k, long_m) is not None}
    out = {}
    for r in rows:
        if "/" in r or family(r) == REFERENCE:
            continue
        items = context_items(r, recent_k, long_m)
        if items is not None and items in nones:
            out[r] = nones[items]
    return out
