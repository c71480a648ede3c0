"""The device side of workbench/hardware.py, checked on the CPU: the one synchronization helper, `dtype: auto`'s
decision for a device, what a device this machine lacks is told, and the GEMM-rate probe's waits.

No GPU is needed: the CUDA branches are exercised by recording the calls they make (torch.cuda.synchronize
replaced), so a timing that forgot to wait, or waited on the CPU, fails here.
"""

from __future__ import annotations

import time

import pytest

from workbench import hardware

torch = pytest.importorskip("torch")


def test_sync_waits_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    for cpu in ("cpu", None, torch.device("cpu")):
        hardware.sync(cpu)
    assert calls == [], "sync on the CPU must be a no-op"
    hardware.sync("cuda:1")
    hardware.sync(torch.device("cuda", 0))
    assert calls == ["cuda:1", torch.device("cuda", 0)]


@pytest.mark.parametrize("device,engine,cpu_bf16,want", [
    ("cuda", None, False, "bfloat16"), ("cuda:3", "torch", False, "bfloat16"), ("cpu", "torch", False, "float32"),
    (None, "torch", True, "bfloat16"), ("cpu", "sglang", False, "bfloat16"), ("cpu", "hf", True, "bfloat16"),
])
def test_auto_dtype_decides_from_the_device_first(device, engine, cpu_bf16, want):
    assert hardware.auto_dtype(device, engine, cpu_has_bf16=cpu_bf16) == want


def test_resolve_dtype_on_a_cuda_device_ignores_the_cpu(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_info", lambda: {"cpu_model": "test", "cpu_flags": "avx2"})  # no bf16 here
    assert hardware.resolve_dtype("auto", "torch") == "float32"
    assert hardware.resolve_dtype("auto", "torch", device="cuda") == "bfloat16"
    assert hardware.resolve_dtype("float32", "torch", device="cuda") == "float32"  # an explicit dtype is kept


def test_device_problem_names_the_fix():
    assert hardware.device_problem("cpu") is None
    for bad in ("gpu", "cuda0", "cpu:1", "CUDA", ""):
        why = hardware.device_problem(bad)
        assert why is not None and "use cpu, cuda or cuda:N" in why, (bad, why)
    if not torch.cuda.is_available():
        why = hardware.device_problem("cuda")
        assert why is not None and "sees no CUDA device" in why and "--device cpu" in why


def test_require_device_raises_a_usage_error():
    from workbench.engines.checks import DeviceError, require_device
    from workbench.errors import UsageError

    assert require_device("cpu") == "cpu"
    with pytest.raises(DeviceError, match="use cpu, cuda or cuda:N") as e:
        require_device("tpu")
    assert isinstance(e.value, UsageError)  # the CLI prints it in a line and exits 2


def test_gemm_rate_waits_after_the_warm_up_and_every_timed_batch(monkeypatch):
    events = []
    monkeypatch.setattr(hardware, "sync", lambda device=None: events.append(("sync", device)))
    rate = hardware.gemm_rate(lambda: events.append("run"), flop=1e9, seconds=0.05, device="cuda:0")
    assert events[:4] == ["run", "run", "run", ("sync", "cuda:0")], events[:6]  # warm-up waited for
    assert events[-1] == ("sync", "cuda:0")  # the last timed batch waited for before the clock was read
    runs = events.count("run") - 3
    assert rate > 0 and runs > 3
    syncs = events.count(("sync", "cuda:0")) - 1
    assert syncs < runs, "on CUDA the batches grow: not one round trip per small GEMM"


def test_device_seconds_on_the_cpu_is_the_wall_clock():
    s = hardware.device_seconds(lambda: time.sleep(0.02), "cpu", reps=2)
    assert 0.015 < s < 0.2


def test_default_gemm_size_follows_the_device():
    assert hardware.default_gemm_n("cpu") == 1024 and hardware.default_gemm_n("cuda:0") == 8192
