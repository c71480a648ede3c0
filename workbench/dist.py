"""Several processes, one study: what each rank does under `torchrun` (docs/distributed.md).

    torchrun --nproc_per_node 8 -m workbench.cli run experiments/personalization_ml1m.yaml

torchrun starts the same command N times and tells each copy its place (RANK, WORLD_SIZE, LOCAL_RANK;
across hosts, with --nnodes and --rdzv-endpoint, the same). Every rank runs the whole pipeline, the same
code in the same order, so the ranks meet at the same collectives; what differs per rank is decided here:

- training (`study/train.py`): every rank builds the same windows and batches (one seed); each takes every
  `size`-th window of a batch, weights its loss by its share of the batch's SID-token targets, and the
  gradients are summed over the ranks before clip + step, so every rank takes the 1-process optimizer step;
- evaluation (`study/evaluate.beam_rank`): blocks of users are dealt to the ranks round-robin and the
  ranked lists gathered back in order, on every rank;
- side effects: only rank 0 (`is_main()`) creates MLflow runs and writes cache entries, checkpoints and
  resume state; the others wait at a barrier and read what it wrote (`cache.cached`). Across hosts,
  WORKBENCH_DATA_DIR must therefore be one folder that every host mounts.

Backend: NCCL for the gradients when the ranks have GPUs (each takes cuda:LOCAL_RANK, `device()`), gloo on
CPUs. Python objects and barriers always go through gloo: a barrier may wait while rank 0 computes alone
(a data stage, SASRec), for up to WORKBENCH_DIST_TIMEOUT_S (6 h by default); a rank that dies ends the
others through torchrun long before that.

Without torchrun's variables (plain `workbench run`, notebooks, tests) this is rank 0 of 1: nothing here
communicates or even imports torch, and every caller takes the single-process path it always took.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
TIMEOUT_S = 6 * 3600.0  # default wait at a barrier (WORKBENCH_DIST_TIMEOUT_S)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_world: World | None = None
_objects: Any = None  # the gloo group for objects and barriers (None: the default group, when that is gloo)


def world() -> World:
    """This process's place among the ranks (torchrun's RANK / WORLD_SIZE / LOCAL_RANK; 0 of 1 without
    them). The first call with more than one rank joins the process group, once per process."""
    global _world
    if _world is None:
        env = os.environ
        w = World(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))
        if w.size > 1:
            _join(w)
        _world = w
    return _world


def is_main() -> bool:
    """Rank 0: the one rank that logs and writes files."""
    return world().is_main


def device() -> str:
    """Where this rank trains and evaluates: its own GPU when torchrun started it on a host with CUDA,
    else the CPU (a plain `workbench run` stays on the CPU, as before; CUDA_VISIBLE_DEVICES= keeps
    torchrun's ranks there too)."""
    if "LOCAL_RANK" not in os.environ:
        return "cpu"
    import torch

    return f"cuda:{int(os.environ['LOCAL_RANK'])}" if torch.cuda.is_available() else "cpu"


def _join(w: World) -> None:
    global _objects
    import atexit
    from datetime import timedelta

    import torch
    import torch.distributed as td

    timeout = timedelta(seconds=float(os.environ.get("WORKBENCH_DIST_TIMEOUT_S", TIMEOUT_S)))
    if device() != "cpu":
        torch.cuda.set_device(w.local_rank)
        td.init_process_group("nccl", timeout=timeout)
        _objects = td.new_group(backend="gloo", timeout=timeout)
    else:
        td.init_process_group("gloo", timeout=timeout)
    atexit.register(td.destroy_process_group)


def shard(seq: T) -> T:
    """This rank's share of a sequence (list, array, range): every `size`-th item from its rank on. Ranks
    get near-equal shares, also of a batch sorted by length; one process gets the sequence itself."""
    w = world()
    return seq if w.size == 1 else seq[w.rank :: w.size]  # type: ignore[index]


def gather(obj: Any) -> list:
    """Every rank's `obj`, in rank order, on every rank (a collective: all ranks call it)."""
    w = world()
    if w.size == 1:
        return [obj]
    import torch.distributed as td

    out: list = [None] * w.size
    td.all_gather_object(out, obj, group=_objects)
    return out


def broadcast(obj: T) -> T:
    """Rank 0's `obj` on every rank (a collective; the others' argument is ignored)."""
    if world().size == 1:
        return obj
    import torch.distributed as td

    box = [obj]
    td.broadcast_object_list(box, src=0, group=_objects)
    return box[0]


def barrier() -> None:
    """Wait until every rank is here."""
    if world().size > 1:
        import torch.distributed as td

        td.barrier(group=_objects)


def all_reduce_sum(tensor) -> None:
    """Sum `tensor` over the ranks, in place, on every rank (on this rank's `device()`: NCCL or gloo)."""
    if world().size > 1:
        import torch.distributed as td

        td.all_reduce(tensor, op=td.ReduceOp.SUM)


def check_same(value: Any, what: str) -> None:
    """Raise on every rank when the ranks disagree on `value` (e.g. a digest of the training batches): ranks
    that silently worked on different inputs would average gradients of different problems."""
    values = gather(value)
    if any(v != values[0] for v in values):
        raise RuntimeError(f"the ranks disagree on {what}: {values}; every rank must read the same data "
                           f"(one WORKBENCH_DATA_DIR, the same code and config)")
