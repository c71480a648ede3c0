"""Compute once, cache by config hash: the one helper every stage, sweep and benchmark uses.

    value, info, hit = cached("als", key, compute=fit_and_save, load=load_saved)

An entry is the folder `data/cache/<kind>/<key>/` (`paths.cache_dir`); `key` is a
`config.section_hash` of everything the product depends on. The entry counts only once its
`done.json` exists, and that file is written last and atomically (temp file + rename), so an
interrupted run never leaves a half entry that looks complete; a compute that raises takes its folder with it
(unless it is resumable, below). An entry without a readable
`done.json` (interrupted, corrupt, or written by hand) is emptied and recomputed. Every hit and
miss prints one line, so a log says what was reused.

`compute(folder) -> (value, info)` writes its files into `folder` and returns the value plus a
JSON-able `info` dict (stats, timings) that is stored in `done.json`; `load(folder, info) ->
value` rebuilds the value on a hit. A `load` that raises (files deleted by hand) is treated like a
miss.

A long compute (training) passes `resumable=True` and keeps its progress in the entry's folder with
`save_state` / `load_state` (`RESUME_FILE`): an interrupted entry is then kept, and the next attempt
goes on from the last save instead of starting over.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, TypeVar

from workbench.paths import cache_dir

T = TypeVar("T")
DONE = "done.json"
RESUME_FILE = "resume.pt"  # a resumable compute's state at its last save (removed once the entry is complete)


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
           resumable: bool = False, collective: bool = False) -> tuple[T, dict, bool]:
    """`(value, info, hit)` for the entry `<kind>/<key>`: loaded when complete, else computed and stored.

    Under torchrun (`workbench.dist`) every rank calls this and only rank 0 writes: rank 0 decides hit or
    miss (and clears a stale entry) before anyone goes on, so the ranks agree. On a miss rank 0 computes
    while the others wait at a barrier, then they load its entry. `collective=True` is for a compute that
    every rank takes part in (training, sharded evaluation) and that writes its files on rank 0 only: all
    ranks compute, and the others still return what rank 0 stored, so every rank holds the same value.
    """
    from workbench import dist

    folder = cache_dir(kind, key)
    main = dist.is_main()
    found = _stored(kind, key, folder, load, say) if main else None
    if main and found is None and any(folder.iterdir()):
        if resumable:
            say(f"  cache {kind}/{key}: incomplete entry kept for resuming")
        else:
            _empty(folder)  # a half-written or corrupt entry: start clean
    if dist.broadcast(found is not None):  # rank 0's answer on every rank (one process: its own)
        value, info = found if main else _stored_by_rank0(folder, load)
        return value, info, True
    if main or collective:
        try:
            value, info = compute(folder)
        except BaseException:
            if main and not resumable:  # nothing half-written stays behind: the next run starts clean
                shutil.rmtree(folder, ignore_errors=True)
            raise
    if main:
        mark_done(folder, info)
        say(f"  cache stored {kind}/{key}")
    dist.barrier()
    if not main:
        value, info = _stored_by_rank0(folder, load)
    return value, info, False


def _stored(kind: str, key: str, folder: Path, load, say) -> tuple[Any, dict] | None:
    """The complete entry's (value, info), or None (missing, incomplete, or unreadable: then said so)."""
    info = read_done(folder)
    if info is None:
        return None
    try:
        value = load(folder, info)
    except (OSError, ValueError, KeyError) as err:
        say(f"  cache {kind}/{key}: stored entry unreadable ({type(err).__name__}: {err}); recomputing")
        return None
    say(f"  cache hit {kind}/{key}")
    return value, info


def _stored_by_rank0(folder: Path, load) -> tuple[Any, dict]:
    """What rank 0 stored (another rank reads it: the data folder must be one that every rank sees)."""
    info = read_done(folder)
    if info is None:
        raise RuntimeError(f"{folder}: rank 0 stored this cache entry, but this rank does not see it; every rank "
                           f"needs the same WORKBENCH_DATA_DIR (one shared folder across hosts)")
    return load(folder, info), info


def save_state(path: Path, state: dict) -> None:
    """Save a resumable compute's state atomically (temp file + rename): a signal mid-write leaves the
    previous save intact."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_state(path: Path) -> dict | None:
    """The state `save_state` wrote, or None when there is none."""
    import torch

    if not path.exists():
        return None
    # tensors and plain containers only (no pickled code); onto the CPU: an RNG state must be a CPU tensor
    # there, and a GPU rank's weights are copied to its own device by load_state_dict
    return torch.load(path, weights_only=True, map_location="cpu")
