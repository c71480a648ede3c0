"""What this CPU can do: its model and the instruction sets that matter, its matmul rate, bf16 or not.

The project's machines are not all the same CPU (an AVX2-only AMD EPYC, or an Intel Xeon with
AVX-512, AVX512-BF16 and AMX where bf16 matmul is ~7x float32), so every measurement names the
CPU it ran on (`cpu_info`, logged with each run) and speed-dependent choices are measured here,
not assumed: `matmul_gflops` is the compute ceiling that engine and training throughput are
reported against.
"""

from __future__ import annotations

import platform
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


def resolve_dtype(dtype: str, engine: str | None = None) -> str:
    """`dtype`, with "auto" made concrete: bfloat16 where this CPU has bf16 instructions (AMX or
    AVX512-BF16: bf16 matmul runs at 2x (AVX512-BF16) to ~7x (AMX) the float32 rate) and float32
    elsewhere (AVX2 only: bf16 would be emulated, slower than float32); bfloat16 for the GPU-only
    engines (FlashInfer and TensorRT-LLM's encode path have no float32 attention)."""
    if dtype != "auto":
        return dtype
    if engine in GPU_ONLY_ENGINES:
        return "bfloat16"
    return "bfloat16" if has_bf16_instructions() else "float32"


def gemm_rate(run, flop: float, seconds: float = 1.0, sync=None) -> float:
    """GFLOP/s of `run()` (one GEMM of `flop` FLOPs): three warm-up calls, then as many as fit in `seconds`."""
    for _ in range(3):
        run()
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        run()
        reps += 1
    if sync is not None:
        sync()
    return flop * reps / (time.perf_counter() - t0) / 1e9


def matmul_gflops(dtype="float32", device: str = "cpu", n: int = 1024, seconds: float = 1.0) -> float:
    """Measured n x n matmul rate (GFLOP/s) at the current torch thread count."""
    import torch

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    return gemm_rate(lambda: a @ b, 2 * n**3, seconds, None if device == "cpu" else torch.cuda.synchronize)
