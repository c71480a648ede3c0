"""Personalization methods by name: each built-in is one module here that registers itself.

`get("soft_token")` returns its `Method`; `names()` lists every registered method, the built-ins first in
`names.METHODS` order (the table order of every study). A method of one's own is one module (or a test file)
that calls `register(Method(...))`; the config then accepts its name in `methods.run` (`config.method_names`).
"""

from __future__ import annotations

from workbench import config
from workbench.study.methods.base import Method, PromptError

_METHODS: dict[str, Method] = {}


class UnknownMethod(PromptError):
    """A method name that no module registered."""


def register(method: Method, replace: bool = False) -> Method:
    """Add `method` under its name; a second method of the same name is refused unless `replace`."""
    if not isinstance(method, Method):
        raise TypeError(f"register takes a Method, got {type(method).__name__}")
    if method.name in _METHODS and not replace:
        raise ValueError(f"a method named {method.name!r} is registered already ({_METHODS[method.name]!r})")
    _METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (a test's own, after the test)."""
    get(name)
    del _METHODS[name]


def get(name: str) -> Method:
    try:
        return _METHODS[name]
    except KeyError:
        raise UnknownMethod(f"unknown method {name!r}; registered methods: {', '.join(_METHODS)}") from None


def names() -> tuple[str, ...]:
    return tuple(_METHODS)


def reading_signal() -> tuple[str, ...]:
    """The registered methods that read a user signal (the ones a signal ablation varies)."""
    return tuple(n for n, m in _METHODS.items() if m.reads_signal)


config.method_names_from(names)  # config validates `methods.run` against this registry from now on
