"""SIGTERM and SIGHUP handled like Ctrl-C, so `timeout`, a cancelled CI job or a closed terminal
cleans up as an interrupt does.

Python turns SIGINT into KeyboardInterrupt, which every `finally`, `with` and `except BaseException`
on the way up sees: the launcher stops its child servers (whole process groups), `tracking.start_run`
ends open MLflow runs as KILLED with what they had logged, temporary folders are removed. SIGTERM's
and SIGHUP's default action kills the process without running any of that, so `install()` makes
them raise `Terminated`, a KeyboardInterrupt that remembers its signal; the CLI exits 128 + signal.

    signals.install()                  # once, in the main thread (the CLI does it)
    with signals.deferred():           # a signal arriving here is delivered when the block ends,
        run = create_run()             # i.e. after the code that protects `run` is in place
    try: ...

The first SIGTERM/SIGHUP raises; later ones are ignored while the cleanup it started runs (that
cleanup is bounded: servers get a grace period, then SIGKILL). SIGKILL cannot be handled by anyone.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

HANDLED = (signal.SIGTERM, signal.SIGHUP)
_DEFERRED = {signal.SIGINT, *HANDLED}


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM or SIGHUP (handled as an interrupt)."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"received {signal.Signals(signum).name}")


def _raise(signum, frame) -> None:
    for sig in HANDLED:  # one cleanup at a time: later signals would abort the `finally` blocks
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install() -> None:
    """Make SIGTERM and SIGHUP raise `Terminated` in the main thread (no-op elsewhere)."""
    if _in_main_thread():
        for sig in HANDLED:
            signal.signal(sig, _raise)


def exit_status(exc: BaseException) -> int:
    """The shell's convention: 128 + the signal number (130 for Ctrl-C)."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP until the block ends, then deliver the first one that came (main
    thread only; elsewhere a no-op).

    For the few lines between creating something that must be cleaned up (an MLflow run) and entering
    the `try` that cleans it up. Python runs signal handlers in the main thread whichever thread the
    kernel picked, so swapping the handlers (not the thread's signal mask) is what holds them."""
    if not _in_main_thread():
        yield
        return
    pending: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in _DEFERRED}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])  # now, to the handler that was in place
