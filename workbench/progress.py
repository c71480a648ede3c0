"""Progress for long work: a tqdm bar on a terminal, a few plain lines anywhere else.

Why not tqdm everywhere: on a pipe or a file (CI, `make demo > log`, a scheduler's log) tqdm
writes one carriage-return frame per refresh, so a log becomes mostly progress frames. Off a
terminal this module prints one line when the work starts, at most one every `LINE_EVERY_S`
seconds while it runs, and one when it ends.

Use it like tqdm: `for x in progress(items, desc="SASRec")`, or `bar = progress(total=n, desc=...)`
then `bar.update(k)` / `bar.set_postfix(loss=...)` / `bar.close()`. `enabled=False` prints nothing.

The libraries draw bars of their own (transformers' "Loading weights" and "Writing model shards",
huggingface_hub's downloads); `quiet_library_bars()`, called once where the CLI starts, switches those
off too when stderr is not a terminal.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Iterable

LINE_EVERY_S = 30.0
HF_BARS_ENV = "HF_HUB_DISABLE_PROGRESS_BARS"  # huggingface_hub's switch, which transformers' bars follow too
_plain = False  # plain lines even on a terminal (`plain_lines()`)


def plain_lines() -> None:
    """Plain lines from now on in this process, terminal or not: for a process that shares its terminal with
    others (a training worker, `study/workers.py`), where tqdm's carriage-return frames would overwrite each other."""
    global _plain
    _plain = True


def stderr_is_terminal() -> bool:
    return not _plain and bool(getattr(sys.stderr, "isatty", lambda: False)())


def quiet_library_bars() -> None:
    """Off a terminal, no tqdm frames from transformers or huggingface_hub either (module doc).

    Through the libraries' own switch, `HF_HUB_DISABLE_PROGRESS_BARS=1`: read when huggingface_hub is first
    imported (transformers takes its default from it), so nothing is imported here, and inherited by child
    processes (training workers, engine servers), whose stderr is the same log. Already imported (a notebook,
    a test), the libraries are told directly. A value the user set wins (`HF_HUB_DISABLE_PROGRESS_BARS=0`
    keeps the bars)."""
    if stderr_is_terminal() or os.environ.setdefault(HF_BARS_ENV, "1") != "1":
        return
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.disable_progress_bar()


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             enabled: bool = True, leave: bool = False):
    """A tqdm bar on a terminal, `_Lines` elsewhere, `_Quiet` when disabled (same small interface) or on
    any torchrun rank but rank 0 (one console, not N interleaved bars; `workbench.dist`)."""
    from workbench import dist

    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    if not enabled or not dist.is_main():
        return _Quiet(iterable)
    if stderr_is_terminal():
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave)
    return _Lines(iterable, total, desc, unit)


class _Quiet:
    def __init__(self, iterable):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable)

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kw) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Lines(_Quiet):
    """Plain progress lines on stderr: start, every LINE_EVERY_S seconds, end."""

    def __init__(self, iterable, total: int | None, desc: str, unit: str):
        super().__init__(iterable)
        self.total, self.desc, self.unit = total, desc or "working", unit
        self.n, self.postfix, self.closed = 0, "", False
        self.t0 = self.last = time.monotonic()
        self._print(f"started ({total} {unit})" if total is not None else "started")

    def __iter__(self):
        for x in self.iterable:
            yield x
            self.update(1)
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= LINE_EVERY_S:
            self.last = now
            self._print(self._state(now))

    def set_postfix(self, **kw) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in kw.items())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._print("done " + self._state(time.monotonic()))

    def _state(self, now: float) -> str:
        of = f"/{self.total}" if self.total is not None else ""
        tail = f", {self.postfix}" if self.postfix else ""
        return f"{self.n}{of} {self.unit} in {now - self.t0:.0f} s{tail}"

    def _print(self, msg: str) -> None:
        print(f"[{self.desc}] {msg}", file=sys.stderr, flush=True)
