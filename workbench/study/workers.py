"""Jobs run side by side in worker processes, stopped with the process that started them.

What the train stage uses to train several models at a time (`training.workers`, stages/train.py says why and
what stays the same). This module knows nothing of the study: it runs `fn(job)` for each job in `n` spawned processes
(fresh interpreters: no forked OpenMP, MLflow or signal state), each set up once by `init(*init_args)`, and calls
`on_done(job, future)` in the calling process as each job ends, in the order they end; the jobs `on_done` returns
join the queue (work that can start only once a job is done).

Stopping is the caller's contract with the user: an exception in the caller's process (Ctrl-C, SIGTERM or SIGHUP
through `workbench.signals`, an error raised by `on_done`) terminates the workers (SIGTERM, then SIGKILL after
STOP_GRACE_S) before it propagates. Workers ignore SIGINT (a terminal sends it to the whole process group: the
caller stops them), print progress as plain lines (several processes share one terminal), and exit if the
calling process dies (checked every PARENT_POLL_S): nothing trains on for nobody.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import signal
import threading
import time
from typing import Any, Callable

PARENT_POLL_S = 2.0
STOP_GRACE_S = 10.0


def cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _exit_with_parent(ppid: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != ppid:  # the calling process died (killed) and this one was handed to init
            os._exit(1)


def _bootstrap(ppid: int, init: Callable | None, init_args: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(ppid,), daemon=True).start()
    from workbench import progress

    progress.plain_lines()
    if init is not None:
        init(*init_args)


def side_by_side(jobs: list, n: int, fn: Callable[[Any], Any], on_done: Callable[[Any, cf.Future], list | None],
                 init: Callable | None = None, init_args: tuple = ()) -> None:
    """`fn(job)` for every job in `n` worker processes; `on_done(job, future)` here as each job ends:
    `future.result()` is what `fn` returned, or raises its error (`BrokenProcessPool` when a worker died); the jobs
    it returns, if any, are queued after those already waiting. `fn` and `init` must be module-level functions (a
    spawned worker imports them by name)."""
    before = set(mp.active_children())
    ex = cf.ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn"),
                                initializer=_bootstrap, initargs=(os.getpid(), init, init_args))
    ok = False
    try:
        pending = {ex.submit(fn, job): job for job in jobs}
        while pending:
            done, _ = cf.wait(pending, timeout=1.0, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                for job in on_done(pending.pop(fut), fut) or ():
                    pending[ex.submit(fn, job)] = job
        ok = True
    finally:
        if ok:
            ex.shutdown(wait=True)
        else:
            _stop(ex, [p for p in mp.active_children() if p not in before])


def _stop(ex: cf.ProcessPoolExecutor, workers: list) -> None:
    """Cancel the jobs not started, terminate the workers (SIGTERM, then SIGKILL after STOP_GRACE_S)."""
    ex.shutdown(wait=False, cancel_futures=True)
    for p in workers:
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in workers:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(STOP_GRACE_S)
