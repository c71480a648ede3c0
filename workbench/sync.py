"""Run a coroutine to completion from synchronous code, including inside Jupyter.

The engines are async; stages, sweeps and notebooks call them from plain functions. In a notebook
an event loop is already running, so `asyncio.run` would refuse: then the coroutine runs on a fresh
loop in a worker thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any


def run_sync(coro) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
