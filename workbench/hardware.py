"""What this machine can do: its CPU (model, instruction sets that matter), its device, its matmul rate, bf16 or not.

The project's machines are not all the same CPU (an AVX2-only AMD EPYC, or an Intel Xeon with
AVX-512, AVX512-BF16 and AMX where bf16 matmul is ~7x float32), so every measurement names the
CPU it ran on (`cpu_info`, logged with each run) and speed-dependent choices are measured here,
not assumed: `matmul_gflops` is the compute ceiling that engine and training throughput are
reported against.

A CUDA device (`--device cuda`, `cuda:N`) runs its kernels asynchronously: a clock read after a call returns
measures the launch, not the work. So every timing that can run on a device waits for it through one helper,
`sync(device)` (a no-op on the CPU), `device_seconds` times a call with CUDA events there, and `dtype: auto`
decides from the device (bfloat16 on CUDA) before it looks at the CPU's flags. `device_problem` says why a device
is not usable here (engines/checks.py turns it into the error raised before anything loads). torch is imported
inside the functions.
"""

from __future__ import annotations

import platform
import re
import time
from functools import lru_cache

FLAGS_THAT_MATTER = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@lru_cache(maxsize=1)
def _cpu_model_and_flags() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or platform.machine(), frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("", platform.machine()):
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    return model, flags


@lru_cache(maxsize=1)
def cpu_info() -> dict[str, str]:
    """{"cpu_model": ..., "cpu_flags": "avx2 avx512f ..."} (only the flags that matter, as present)."""
    model, flags = _cpu_model_and_flags()
    return {"cpu_model": model, "cpu_flags": " ".join(f for f in FLAGS_THAT_MATTER if f in flags)}


def has_cpu_flag(flag: str) -> bool:
    """Whether /proc/cpuinfo lists `flag` (False where it cannot be read), e.g. avx512_vnni for the int8 kernels."""
    return flag in _cpu_model_and_flags()[1]


def has_bf16_instructions() -> bool:
    flags = cpu_info()["cpu_flags"].split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


GPU_ONLY_ENGINES = ("sglang", "trtllm")  # no CPU build: "auto" is their serving dtype on a GPU


def is_cuda(device) -> bool:
    """Whether `device` (a string such as "cuda:1", a torch.device or None) names a CUDA device."""
    return device is not None and str(device).split(":")[0] == "cuda"


def auto_dtype(device=None, engine: str | None = None, cpu_has_bf16: bool = False) -> str:
    """What `dtype: auto` means, as a pure decision: bfloat16 on a CUDA device (its tensor cores: an H100-class data
    sheet gives bf16 about 2x TF32 and 15x plain float32; every GPU engine serves in it) and for the GPU-only
    engines (FlashInfer and TensorRT-LLM's encode path have no float32 attention); on the CPU, bfloat16 where it has
    bf16 instructions (AMX or AVX512-BF16: bf16 matmul at 2x (AVX512-BF16) to ~7x (AMX) the float32 rate) and float32
    elsewhere (AVX2 only: bf16 would be emulated, slower than float32)."""
    if is_cuda(device) or engine in GPU_ONLY_ENGINES:
        return "bfloat16"
    return "bfloat16" if cpu_has_bf16 else "float32"


def resolve_dtype(dtype: str, engine: str | None = None, device=None) -> str:
    """`dtype`, with "auto" made concrete for `engine` on `device` (`auto_dtype`; this CPU's flags where the
    device is the CPU or not given)."""
    if dtype != "auto":
        return dtype
    return auto_dtype(device, engine, has_bf16_instructions())


_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def device_problem(name: str) -> str | None:
    """Why this machine cannot run on device `name` (cpu | cuda | cuda:N), with what to use instead; None where it
    can. A bad name is told without importing torch. (The error built from it, DeviceError, is raised one layer up,
    in engines/checks.py: this frame module imports no other workbench module.)"""
    name = str(name).strip()
    if not _DEVICE.match(name):
        return (f"device {name!r} is not one the workbench runs on; use cpu, cuda or cuda:N (N: the GPU's index, "
                "as nvidia-smi lists them)")
    if not is_cuda(name):
        return None
    import torch

    if not torch.cuda.is_available():
        why = ("a CPU-only build" if torch.version.cuda is None else
               f"built for CUDA {torch.version.cuda}, but no GPU or driver is visible: see CUDA_VISIBLE_DEVICES, "
               "nvidia-smi")
        return f"device {name}: torch {torch.__version__} sees no CUDA device ({why}); use cpu (--device cpu)"
    count = torch.cuda.device_count()
    index = int(name.split(":")[1]) if ":" in name else 0
    if index >= count:
        return (f"device {name}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}; use one of those or "
                "cpu (--device cpu)")
    return None


def sync(device=None) -> None:
    """Wait until the work queued on `device` is done (torch.cuda.synchronize on CUDA; nothing on the CPU, whose
    kernels return when done). Every timing that can run on a device reads its clock after this."""
    if is_cuda(device):
        import torch

        torch.cuda.synchronize(device)


def device_seconds(fn, device=None, reps: int = 1) -> float:
    """Seconds per call of `fn()` over `reps` calls: CUDA events around them on a CUDA device (the GPU's own clock,
    no host round trip inside the span), the wall clock on the CPU; queued work is waited for before and after."""
    sync(device)
    if is_cuda(device):
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def device_name(device=None) -> str:
    """The model of what `device` names: the GPU's (torch.cuda.get_device_name) on CUDA, else the CPU's."""
    if is_cuda(device):
        import torch

        return torch.cuda.get_device_name(device)
    return cpu_info()["cpu_model"]


def device_info(device=None) -> dict:
    """What a record names about `device`: {"device", "device_name"} and, on CUDA, the GPU's memory, compute
    capability, multiprocessor count, torch's CUDA version and the driver (nvidia-smi's, where it runs)."""
    out = {"device": str(device or "cpu"), "device_name": device_name(device), **cpu_info()}
    if not is_cuda(device):
        return out
    import torch

    props = torch.cuda.get_device_properties(device)
    out.update(gpu_memory_gib=round(props.total_memory / 2**30, 1), compute_capability=f"{props.major}.{props.minor}",
               multiprocessors=props.multi_processor_count, cuda=torch.version.cuda, driver=_nvidia_driver())
    return out


def _nvidia_driver() -> str | None:
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def gemm_rate(run, flop: float, seconds: float = 1.0, device=None) -> float:
    """GFLOP/s of `run()` (one GEMM of `flop` FLOPs on `device`): three warm-up calls, waited for, then as many
    as fit in `seconds`. On a CUDA device each timed batch is waited for (`sync`) before the clock is read, and
    the batch doubles while it takes under 1% of `seconds` (a sync per small GEMM would time the round trip);
    on the CPU every call is its own batch."""
    for _ in range(3):
        run()
    sync(device)
    reps, batch, t0 = 0, 1, time.perf_counter()
    while True:
        t_batch = time.perf_counter()
        for _ in range(batch):
            run()
        sync(device)
        reps += batch
        now = time.perf_counter()
        if now - t0 >= seconds:
            return flop * reps / (now - t0) / 1e9
        if is_cuda(device) and now - t_batch < seconds / 100:
            batch *= 2


def default_gemm_n(device=None) -> int:
    """The square GEMM a matmul rate is measured at: 1024 on the CPU (its BLAS peaks there), 8192 on a CUDA device
    (a 1024^3 GEMM is a few microseconds on a data-centre GPU, far below its peak: launch-bound)."""
    return 8192 if is_cuda(device) else 1024


def matmul_gflops(dtype="float32", device: str = "cpu", n: int | None = None, seconds: float = 1.0) -> float:
    """Measured n x n matmul rate (GFLOP/s) at the current torch thread count (`n`: `default_gemm_n`)."""
    import torch

    n = n or default_gemm_n(device)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    return gemm_rate(lambda: a @ b, 2 * n**3, seconds, device)
