"""float32 layer GEMMs on oneDNN where that is faster than PyTorch's default float32 GEMM on this CPU.

Why: PyTorch's x86 builds run a float32 `F.linear` on MKL, and MKL's fastest (AVX-512) kernels are not
what it picks on every CPU. On a 2-core AMD EPYC Zen 5 (`lscpu` CPU family 26, full-width AVX-512, torch
2.13, one thread, 2026-12-01) the engine's float32 shapes ran at 101-119 GFLOP/s through `F.linear`
and at 253-278 GFLOP/s through oneDNN (PyTorch's other CPU GEMM library, the one vLLM-CPU uses) with
the weight packed once: 512x512x3072, 512x1536x512, 30x512x3072, 30x1536x512, 1024^3. bfloat16 GEMMs go
through oneDNN already, so this is a float32 matter. Which library wins depends on the CPU, so `choose`
times both at the model's own shape once, at load, and keeps oneDNN only where it is clearly faster;
`gemm="onednn"` / `gemm="default"` force a side (the tests run both).

Numerics: both are float32 GEMMs with float32 accumulation; they differ only in summation order (max
|diff| to a float64 product of unit normals over 512 terms: ~1e-4 oneDNN, ~5e-5 MKL), well inside the
float32 bound the parity tests derive (workbench/engines/numerics.py). The lm_head stays on `F.linear`
(<1% of a request's FLOPs; it may be tied to the embedding).
"""

from __future__ import annotations

import time
from functools import lru_cache

import torch
from torch import Tensor

GEMM_MODES = ("auto", "default", "onednn")
MIN_SPEEDUP = 1.15  # `auto` keeps oneDNN only above this measured speed-up (below it: run-to-run noise)
PACK_ROWS = 256  # row count oneDNN packs the weight for; any row count works with it


def available() -> bool:
    """PyTorch was built with oneDNN (mkldnn) and its packed linear kernel."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class OneDNNLinear:
    """x @ w.T + b with `w` [out, in] float32 packed once for oneDNN."""

    def __init__(self, w: Tensor, b: Tensor | None = None):
        w = w.detach().float().contiguous()
        self.shape = tuple(w.shape)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        self.bias = None if b is None else b.detach().float().contiguous()

    def __call__(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def numel(self) -> int:
        """Weights it multiplies by (as `Tensor.numel` of the float weight: the FLOP count reads it)."""
        return self.shape[0] * self.shape[1]


def _best_s(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measured_speedup(w: Tensor, rows: int = PACK_ROWS, repeats: int = 5) -> float:
    """How many times faster oneDNN runs `rows` x w.T than `F.linear` here, now (best of `repeats` each)."""
    x = torch.randn(rows, w.shape[1], dtype=torch.float32)
    fast = OneDNNLinear(w)
    w = w.detach().float().contiguous()
    return _best_s(lambda: torch.nn.functional.linear(x, w), repeats) / _best_s(lambda: fast(x), repeats)


@lru_cache(maxsize=None)
def _speedup_at(out_features: int, in_features: int, threads: int) -> float:
    """measured_speedup on a random weight of this shape, once per shape and thread count in a process (what it
    measures is the libraries on this CPU, not the weight's values), so engines after the first load without it."""
    return measured_speedup(torch.randn(out_features, in_features))


def choose(mode: str, w: Tensor, device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """("onednn" | "default", why) for `mode` on this model's float32 GEMM weight `w` (the largest layer GEMM)."""
    if mode not in GEMM_MODES:
        raise ValueError(f"gemm={mode!r}: expected one of {GEMM_MODES}")
    if mode == "default":
        return "default", "asked for"
    if device.type != "cpu" or dtype != torch.float32:
        why = "oneDNN float32 GEMMs are a CPU float32 option"
        if mode == "onednn":
            raise ValueError(f"gemm='onednn' needs device cpu and dtype float32 ({why}); use gemm='auto'")
        return "default", why
    if not available():
        if mode == "onednn":
            raise ValueError("gemm='onednn': this PyTorch build has no oneDNN linear kernel; use gemm='auto'")
        return "default", "this PyTorch build has no oneDNN linear kernel"
    if mode == "onednn":
        return "onednn", "asked for"
    speedup = _speedup_at(int(w.shape[0]), int(w.shape[1]), torch.get_num_threads())
    if speedup >= MIN_SPEEDUP:
        return "onednn", f"measured {speedup:.2f}x faster than F.linear here"
    return "default", f"oneDNN measured {speedup:.2f}x F.linear here (keeps it above {MIN_SPEEDUP}x)"


def pack_layers(layers: list) -> None:
    """Replace every layer's float32 GEMM weights (torch_model.LayerWeights) by OneDNNLinear, biases packed in."""
    from workbench.engines.torch_model import replace_layer_gemms

    replace_layer_gemms(layers, OneDNNLinear)


def gflops(n: int = 1024, seconds: float = 1.0) -> float:
    """Measured n x n float32 GEMM rate through oneDNN (packed weight), GFLOP/s at the current thread count: the
    counterpart of hardware.matmul_gflops, so a compute floor uses the faster of the two libraries."""
    from workbench.hardware import gemm_rate

    x, fast = torch.randn(n, n), OneDNNLinear(torch.randn(n, n))
    return gemm_rate(lambda: fast(x), 2 * n**3, seconds)
