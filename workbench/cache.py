"""Compute once, cache by config hash: the one helper every stage, sweep and benchmark uses.

    value, info, hit = cached("als", key, compute=fit_and_save, load=load_saved)

An entry is the folder `data/cache/<kind>/<key>/` (`paths.cache_dir`); `key` is a
`config.section_hash` of everything the product depends on. The entry counts only once its
`done.json` exists, and that file is written last and atomically (temp file + rename), so an
interrupted run never leaves a half entry that looks complete. An entry without a readable
`done.json` (interrupted, corrupt, or written by hand) is emptied and recomputed. Every hit and
miss prints one line, so a log says what was reused.

`compute(folder) -> (value, info)` writes its files into `folder` and returns the value plus a
JSON-able `info` dict (stats, timings) that is stored in `done.json`; `load(folder, info) ->
value` rebuilds the value on a hit. A `load` that raises (files deleted by hand) is treated like a
miss.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, TypeVar

from workbench.paths import cache_dir

T = TypeVar("T")
DONE = "done.json"


def read_done(folder: Path) -> dict | None:
    """The entry's stored info, or None when the entry is not complete (missing or unreadable done.json)."""
    f = Path(folder) / DONE
    try:
        info = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def mark_done(folder: Path, info: dict) -> None:
    """Write `done.json` last, atomically: the entry is complete from this point on."""
    tmp = Path(folder) / (DONE + ".tmp")
    tmp.write_text(json.dumps(info, indent=2, default=float))
    tmp.replace(Path(folder) / DONE)


def _empty(folder: Path) -> None:
    for p in folder.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def cached(kind: str, key: str, compute: Callable[[Path], tuple[T, dict]],
           load: Callable[[Path, dict], T], say: Callable[[str], Any] = print,
           resumable: bool = False) -> tuple[T, dict, bool]:
    """`(value, info, hit)` for the entry `<kind>/<key>`: loaded when complete, else computed and stored."""
    folder = cache_dir(kind, key)
    info = read_done(folder)
    if info is not None:
        try:
            value = load(folder, info)
        except (OSError, ValueError, KeyError) as err:
            say(f"  cache {kind}/{key}: stored entry unreadable ({type(err).__name__}: {err}); recomputing")
        else:
            say(f"  cache hit {kind}/{key}")
            return value, info, True
    if any(folder.iterdir()):
        if resumable:
            say(f"  cache {kind}/{key}: incomplete entry kept for resuming")
        else:
            _empty(folder)  # a half-written or corrupt entry: start clean
    value, info = compute(folder)
    mark_done(folder, info)
    say(f"  cache stored {kind}/{key}")
    return value, info, False
