"""Personalization methods by name: each built-in is one module here that registers itself.

`get("soft_token")` returns its `Method`, `get("soft_token-k5")` the same at 5 history items (a context variant,
`variants.py`); `names()` lists every registered method, the built-ins first in `names.METHODS` order (the table
order of every study). A method of one's own is one module (or a test file)
that calls `register(Method(...))`; the config then accepts its name in `methods.run` (`config.method_names`).
"""

from __future__ import annotations

from workbench import config
from workbench import names as _names  # `names()` below lists the methods
from workbench.study.methods import variants
from workbench.study.methods.base import Method, PromptError

_METHODS: dict[str, Method] = {}
_variants: dict[str, Method] = {}  # the context variants `get` derived (cleared when the registry changes)


class UnknownMethod(PromptError):
    """A method name that no module registered."""


def register(method: Method, replace: bool = False) -> Method:
    """Add `method` under its name; a second method of the same name is refused unless `replace`."""
    if not isinstance(method, Method):
        raise TypeError(f"register takes a Method, got {type(method).__name__}")
    if _names.split_context_variant(method.name)[1] is not None:
        raise ValueError(f"{method.name!r} is a context variant's name: `get` derives it from its method (register "
                         "the method under an identifier and list the context in methods.contexts)")
    _variants.clear()
    if method.name in _METHODS and not replace:
        raise ValueError(f"a method named {method.name!r} is registered already ({_METHODS[method.name]!r})")
    _METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (a test's own, after the test)."""
    get(name)
    del _METHODS[name]
    _variants.clear()


def get(name: str) -> Method:
    """The registered method `name`, or the context variant `name` names (`none-k5`: `none` at 5 items)."""
    if name in _METHODS:
        return _METHODS[name]
    if name in _variants:
        return _variants[name]
    base, items = _names.split_context_variant(name)
    if base not in _METHODS:
        raise UnknownMethod(f"unknown method {name!r}; registered methods: {', '.join(_METHODS)}"
                            + (f" (context variants: <method>{_names.CONTEXT_MARK}<items>, e.g. "
                               f"{_names.context_variant('none', 5)})" if items is not None else ""))
    if items < 1:
        raise UnknownMethod(f"method {name!r}: a context variant shows >= 1 history items, got {items}")
    _variants[name] = variants.variant(_METHODS[base], items)
    return _variants[name]


def names() -> tuple[str, ...]:
    return tuple(_METHODS)


def reading_signal() -> tuple[str, ...]:
    """The registered methods that read a user signal (the ones a signal ablation varies)."""
    return tuple(n for n, m in _METHODS.items() if m.reads_signal)


config.method_names_from(names)  # config validates `methods.run` against this registry from now on
