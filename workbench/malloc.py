"""Large tensors on transparent huge pages, freed memory kept: every `workbench` command runs with three glibc
malloc tunables (`TUNABLES`).

Why: PyTorch's CPU tensors come from glibc's malloc, which serves large blocks with a fresh `mmap` (or gives
freed heap back to the kernel) and so faults their memory in again on the next use, one 4 KiB page at a
time; in these VMs a page fault costs ~1.8 us: allocating and filling a fresh 64 MiB float32 tensor took
30 ms, filling an existing one 2 ms (AMD EPYC Zen 5, 1 thread, 2026-12-02). One quickstart training of
`none` took 20.7M minor faults in 95 s; one 25m bfloat16 beam request in the torch engine 1,100-3,900.
With `glibc.malloc.hugetlb=1` (glibc >= 2.35) malloc asks for transparent huge pages, so a fault brings in
2 MiB: the 64 MiB tensor took 4.5 ms and the training 1.76M faults (same losses and validation NDCG to the
digit); with the two thresholds as well, freed blocks up to 32 MiB stay in malloc's heap and the beam
request took 0-400 faults (docs/performance-tools.md, "Huge pages").

How: glibc reads its tunables once, when the process starts, so the CLI re-executes itself once with them
added (`reexec_with_hugepages`, before any heavy import); the servers and workers it starts inherit them,
vLLM-CPU's included, so engines compared side by side run on the same allocator settings. Nothing changes
where the kernel has transparent huge pages off, on other C libraries, when `GLIBC_TUNABLES` already sets
one of them, or with `WORKBENCH_HUGEPAGES=0`. Numerics are untouched: only where memory comes from
changes. The cost (glibc's documented behaviour, not measured here): a process can keep up to 256 MiB of
freed memory per malloc arena instead of returning it to the kernel.
For a notebook or your own script, start Jupyter / python with the variable set (`hugepages_env()`).
"""

from __future__ import annotations

import os
import platform
import sys
from functools import lru_cache
from pathlib import Path

# hugetlb: huge pages for what malloc maps; the two thresholds keep freed blocks up to 32 MiB (the largest
# mmap_threshold glibc accepts) in the heap, and up to 256 MiB of free heap before returning it to the kernel,
# so the next forward's tensors reuse memory already faulted in (glibc's own defaults adapt up to 32 / 64 MiB).
TUNABLES = {"glibc.malloc.hugetlb": "1", "glibc.malloc.mmap_threshold": str(32 << 20),
            "glibc.malloc.trim_threshold": str(256 << 20)}
SETTING = ":".join(f"{k}={v}" for k, v in TUNABLES.items())
OPT_OUT = "WORKBENCH_HUGEPAGES"  # "0": leave malloc as it is
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIN_GLIBC = (2, 35)  # the first glibc with the hugetlb tunable


def _thp_mode() -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise", "never"), None where unknown."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


def _glibc() -> tuple[int, ...] | None:
    lib, version = platform.libc_ver()
    if lib != "glibc" or not version:
        return None
    try:
        return tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return None


@lru_cache(maxsize=1)
def supported() -> tuple[bool, str]:
    """(whether the tunables can act here, why not). The thresholds alone would act without huge pages too; they
    are kept together so that one switch means one measured configuration."""
    glibc = _glibc()
    if glibc is None:
        return False, "not glibc"
    if glibc < MIN_GLIBC:
        return False, f"glibc {'.'.join(map(str, glibc))} < {'.'.join(map(str, MIN_GLIBC))}"
    mode = _thp_mode()
    if mode in (None, "never"):
        return False, f"transparent huge pages are {mode or 'unavailable'} in this kernel"
    return True, ""


def _set_by_user(env) -> bool:
    """GLIBC_TUNABLES already sets one of ours: the user's (or a parent's) choice stands."""
    return any(part.split("=")[0] in TUNABLES for part in env.get("GLIBC_TUNABLES", "").split(":") if part)


def active(env=None) -> bool:
    """This process was started with all of TUNABLES (glibc read them at start) and they can act here."""
    env = os.environ if env is None else env
    parts = set(env.get("GLIBC_TUNABLES", "").split(":"))
    return all(f"{k}={v}" in parts for k, v in TUNABLES.items()) and supported()[0]


def hugepages_env(env=None) -> dict[str, str]:
    """`env` (default os.environ) with TUNABLES added to GLIBC_TUNABLES, unless it sets one of them already."""
    env = dict(os.environ if env is None else env)
    if not _set_by_user(env):
        env["GLIBC_TUNABLES"] = ":".join(p for p in (env.get("GLIBC_TUNABLES", ""), SETTING) if p)
    return env


def reexec_with_hugepages() -> None:
    """Replace this process by itself started with TUNABLES, where they can act and none is set yet (nor opted out).

    Call first thing in a console entry point: what ran before is run again."""
    if os.environ.get(OPT_OUT, "1") == "0" or _set_by_user(os.environ) or not supported()[0]:
        return
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], hugepages_env())
