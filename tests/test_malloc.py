"""workbench/malloc.py: large tensors on huge pages (fewer page faults), and the environment it sets."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbench import malloc

# A fresh 64 MiB tensor, filled: 16,384 faults of 4 KiB pages without huge pages; with them a few hundred
# (one per 2 MiB page where the kernel finds one, plus malloc's own small pages).
FAULTS_PROBE = """
import json, resource, sys, torch
from workbench import malloc
torch.set_num_threads(1)
n = 64 << 20
torch.empty(n // 4).fill_(1.0)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    torch.empty(n // 4).fill_(1.0)
print(json.dumps({"faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 5, "active": malloc.active()}))
"""
PAGES_4K = (64 << 20) // 4096


def _probe(env) -> dict:
    out = subprocess.run([sys.executable, "-c", FAULTS_PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_env_adds_the_tunables_and_keeps_the_users():
    assert malloc.SETTING == ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:"
                              "glibc.malloc.trim_threshold=268435456")
    assert malloc.hugepages_env({})["GLIBC_TUNABLES"] == malloc.SETTING
    env = malloc.hugepages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "X": "1"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + malloc.SETTING and env["X"] == "1"
    for mine in ("glibc.malloc.hugetlb=0", "glibc.malloc.trim_threshold=0"):  # the user's own choice wins
        assert malloc.hugepages_env({"GLIBC_TUNABLES": mine})["GLIBC_TUNABLES"] == mine
        assert not malloc.active({"GLIBC_TUNABLES": mine})


def test_hugepages_cut_the_page_faults_of_large_tensors():
    ok, why = malloc.supported()
    if not ok:
        pytest.skip(f"malloc huge pages cannot act here: {why}")
    env = {k: v for k, v in malloc.hugepages_env().items()}
    plain = dict(env, GLIBC_TUNABLES="glibc.malloc.hugetlb=0")
    off, on = _probe(plain), _probe(env)
    assert not off["active"] and on["active"]
    if malloc._thp_mode() == "madvise":  # with "always" the kernel gives huge pages unasked: no premise to check
        assert off["faults"] >= PAGES_4K * 0.9, off  # the premise: each fresh large tensor faults every 4 KiB page
    assert on["faults"] <= PAGES_4K / 4, (on, off)


def test_the_console_command_reexecutes_itself_once(tmp_path):
    """What `workbench` does first (cli.main without argv): the same command again, now with the tunable."""
    ok, why = malloc.supported()
    if not ok:
        pytest.skip(f"malloc huge pages cannot act here: {why}")
    code = ("import os; from workbench.malloc import reexec_with_hugepages as r; "
            "open(os.environ['OUT'], 'a').write(os.environ.get('GLIBC_TUNABLES', '-') + '\\n'); r()")
    env = {k: v for k, v in malloc.hugepages_env().items() if k != "GLIBC_TUNABLES"} | {"OUT": str(tmp_path / "o")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert (tmp_path / "o").read_text().splitlines() == ["-", malloc.SETTING]
    subprocess.run([sys.executable, "-c", code], env=env | {"WORKBENCH_HUGEPAGES": "0"}, check=True)
    assert (tmp_path / "o").read_text().splitlines()[2:] == ["-"]
