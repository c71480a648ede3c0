"""The layer GEMMs on oneDNN with weights packed once, where that is faster than PyTorch's default GEMM on this CPU.

float32. Why: PyTorch's x86 builds run a float32 `F.linear` on MKL, and MKL's fastest (AVX-512) kernels are
not what it picks on every CPU. On a 2-core AMD EPYC Zen 5 (`lscpu` CPU family 26, full-width AVX-512, torch
2.13, one thread, 2026-12-01) the engine's float32 shapes ran at 101-119 GFLOP/s through `F.linear`
and at 253-278 GFLOP/s through oneDNN (PyTorch's other CPU GEMM library, the one vLLM-CPU uses) with
the weight packed once: 512x512x3072, 512x1536x512, 30x512x3072, 30x1536x512, 1024^3. Which library wins
depends on the CPU, so `choose` times both at the model's own shape once, at load, and keeps oneDNN only
where it is clearly faster; `gemm="onednn"` / `gemm="default"` force a side (the tests run both).
Numerics: both are float32 GEMMs with float32 accumulation; they differ only in summation order (max
|diff| to a float64 product of unit normals over 512 terms: ~1e-4 oneDNN, ~5e-5 MKL), well inside the
float32 bound the parity tests derive (workbench/engines/numerics.py).

bfloat16. `F.linear` runs on oneDNN already, but re-lays out the weight into oneDNN's blocked format on
every call; packed once, the same kernel skips that. Same CPU, 2026-12-02, the 25m model's four layer
GEMMs x 8 layers cycled (so weights come from memory, as in a forward): 1.45x faster at 30 rows (a beam-30
decode step: 8.8 -> 6.0 ms), 1.1x at 120, 1.06x at 512 rows, and 2-3x at 1-4 rows; the results are equal
to `F.linear`'s bit for bit (tests/test_torch_variants.py), so `auto` packs them wherever oneDNN has a
bfloat16 kernel for this CPU, with no timing to decide.

The lm_head stays on `F.linear` (<1% of a request's FLOPs; it may be tied to the embedding); in bfloat16 that
is oneDNN as well, so its rows follow the same ladder (`lm_head_on_ladder`, below).

Row counts. oneDNN builds (JIT-compiles) and caches one primitive per GEMM shape, in a cache of 1,024, and a
primitive keeps 0.6-6 MB (0.6 MB on average over 1-300 rows for weights from 64x64 to 1536x512; ~3 MB near 256 rows
float32 and ~6 MB near 1,024 rows bfloat16 for 3072x512; AMD EPYC Zen 5, torch 2.13 / oneDNN 3.12, 2026-12-07). A
server's forwards have every row count, so its memory rose with the cache: `workbench serve` grew 406-446 MiB over
the 2,000-request soak (tests/test_soak.py) and was still rising after 10,000. So a call's rows are padded up to the
next value of a fixed ladder (`padded_rows`: multiples of 8 up to 64, then eight steps per octave, so under 1/8 of
the rows is padding) and a call of more than CHUNK_ROWS rows runs in chunks of it: 32 shapes per weight, which
`pack_layers` builds at load (`warm`), so no forward builds one afterwards. Cost, measured on the same CPU
(docs/results/2026-12-07-onednn-row-ladder-zen5.md): 0.22 s and ~110 MiB at load for the 25m float32 model (~76 MiB
bfloat16); a beam request (prompt 512, beam 30) within 1% of the unpadded GEMMs; a call over CHUNK_ROWS pays the
chunks' concatenation (~5% per request when the ladder stopped at 256 rows). Not laddered: the attention's
batched matmuls, on oneDNN in bfloat16; they still build a few primitives per shape: the bfloat16 soak's server
grew 15-16 MiB after its warm-up over 2,000 and over 8,000 requests (not with their number; float32 1-4 MiB).
"""

from __future__ import annotations

import statistics
import time
from functools import lru_cache
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from workbench.engines.torch.layers import replace_layer_gemms

GEMM_MODES = ("auto", "default", "onednn")
MIN_SPEEDUP = 1.15  # `auto` keeps oneDNN only above this measured speed-up (below it: run-to-run noise)
PACK_ROWS = 256  # row count oneDNN packs the weight for; any row count works with it
CHUNK_ROWS = 512  # the ladder's top: a forward with more rows runs in chunks of this many (module doc)
STEPS_PER_OCTAVE = 8  # ladder values per doubling of the rows: padding stays under 1/8 of them


def padded_rows(n: int) -> int:
    """The ladder value a call with `n` rows (1 <= n <= CHUNK_ROWS) runs at: n rounded up to a multiple of 8 up
    to 64; above, to a multiple of 1/8 of the power of two just below n (so n <= padded < n * 9/8)."""
    if n <= 64:
        return -(-n // 8) * 8
    step = (1 << ((n - 1).bit_length() - 1)) // STEPS_PER_OCTAVE
    return -(-n // step) * step


def ladder() -> list[int]:
    """Every row count the packed GEMMs run at (32 values, 8 to CHUNK_ROWS)."""
    return sorted({padded_rows(n) for n in range(1, CHUNK_ROWS + 1)})


def on_ladder(run: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """run(x) for x [n, in], with `run` called at ladder row counts only: x's rows padded up to the next one, or
    split into chunks of CHUNK_ROWS (module doc, "Row counts"). `run` must treat rows independently (a GEMM)."""
    n = int(x.shape[0])
    if n > CHUNK_ROWS:
        return torch.cat([on_ladder(run, part) for part in x.split(CHUNK_ROWS)])
    pad = padded_rows(max(n, 1)) - n
    return run(F.pad(x, (0, 0, 0, pad)))[:n] if pad else run(x)


def warm_ladder(run: Callable[[Tensor], Tensor], in_features: int, dtype: torch.dtype) -> None:
    """Build the primitive of every ladder row count of `run` now (one call each on zeros), not under load."""
    x = torch.zeros(CHUNK_ROWS, in_features, dtype=dtype)
    for n in ladder():
        run(x[:n])


def lm_head_on_ladder(device: torch.device, dtype: torch.dtype, batch_invariant: bool) -> bool:
    """The engine's lm_head (`F.linear`, not packed) runs on oneDNN too: in bfloat16 on a CPU with its bfloat16
    kernel (float32 `F.linear` runs on MKL, which builds nothing per shape); batch_invariant pins its own rows."""
    return device.type == "cpu" and dtype == torch.bfloat16 and not batch_invariant and bf16_supported()


def available() -> bool:
    """PyTorch was built with oneDNN (mkldnn) and its packed linear kernel."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


DTYPES = (torch.float32, torch.bfloat16)


def bf16_supported() -> bool:
    """oneDNN has a bfloat16 GEMM kernel for this CPU (AVX-512 and up; not on AVX2-only CPUs)."""
    return available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class OneDNNLinear:
    """x @ w.T + b with `w` [out, in] (float32 or bfloat16, kept in its dtype) packed once for oneDNN."""

    def __init__(self, w: Tensor, b: Tensor | None = None):
        if w.dtype not in DTYPES:
            raise ValueError(f"oneDNN packed GEMMs take {DTYPES}, not {w.dtype}")
        w = w.detach().contiguous()
        self.shape = tuple(w.shape)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        self.bias = None if b is None else b.detach().to(w.dtype).contiguous()

    def _run(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def __call__(self, x: Tensor) -> Tensor:
        """x [n, in] -> [n, out], run at ladder row counts only (module doc, "Row counts")."""
        return on_ladder(self._run, x)

    def warm(self) -> None:
        warm_ladder(self._run, self.shape[1], self.packed.dtype)

    def numel(self) -> int:
        """Weights it multiplies by (as `Tensor.numel` of the float weight: the FLOP count reads it)."""
        return self.shape[0] * self.shape[1]


def _best_s(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measured_speedup(w: Tensor, rows: int = PACK_ROWS, repeats: int = 3, rounds: int = 7) -> float:
    """How many times faster oneDNN runs `rows` x w.T than `F.linear` here, now: the median over `rounds` of the
    ratio of the two libraries' best of `repeats`, timed back to back in alternating order.

    Why rounds: this host's speed moves 10-30% within minutes (docs/results/2026-12-02-engines-zen5.md), and one
    best-of-5 of each library in turn put the two in different windows: on an AMD EPYC Zen 4, where oneDNN measured
    1.29-1.52x, one load measured it under MIN_SPEEDUP and kept `F.linear` (2026-12-02). Pairs side by side share
    their window."""
    x = torch.randn(rows, w.shape[1], dtype=torch.float32)
    fast = OneDNNLinear(w)
    w = w.detach().float().contiguous()
    sides = (lambda: torch.nn.functional.linear(x, w), lambda: fast(x))  # [F.linear, oneDNN]
    for f in sides:  # warm-up: first-call packing and page faults
        f()
    ratios = []
    for i in range(rounds):
        t = [0.0, 0.0]
        for j in ((0, 1) if i % 2 == 0 else (1, 0)):
            t[j] = _best_s(sides[j], repeats)
        ratios.append(t[0] / t[1])
    return statistics.median(ratios)


@lru_cache(maxsize=None)
def _speedup_at(out_features: int, in_features: int, threads: int) -> float:
    """measured_speedup on a random weight of this shape, once per shape and thread count in a process (what it
    measures is the libraries on this CPU, not the weight's values), so engines after the first load without it."""
    return measured_speedup(torch.randn(out_features, in_features))


def choose(mode: str, w: Tensor, device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """("onednn" | "default", why) for `mode` on this model's GEMM weight `w` (the largest layer GEMM) in `dtype`."""
    if mode not in GEMM_MODES:
        raise ValueError(f"gemm={mode!r}: expected one of {GEMM_MODES}")
    if mode == "default":
        return "default", "asked for"
    why = None
    if device.type != "cpu" or dtype not in DTYPES:
        why = "packed oneDNN GEMMs are a CPU float32 / bfloat16 option"
    elif not available():
        why = "this PyTorch build has no oneDNN linear kernel"
    elif dtype == torch.bfloat16 and not bf16_supported():
        why = "oneDNN has no bfloat16 kernel for this CPU"
    if why is not None:
        if mode == "onednn":
            raise ValueError(f"gemm='onednn' cannot run here ({why}); use gemm='auto'")
        return "default", why
    if mode == "onednn":
        return "onednn", "asked for"
    if dtype == torch.bfloat16:
        return "onednn", "bfloat16: F.linear's own oneDNN kernel with the weight packed once (same results, bit for bit)"
    speedup = _speedup_at(int(w.shape[0]), int(w.shape[1]), torch.get_num_threads())
    if speedup >= MIN_SPEEDUP:
        return "onednn", f"measured {speedup:.2f}x faster than F.linear here"
    return "default", f"oneDNN measured {speedup:.2f}x F.linear here (keeps it above {MIN_SPEEDUP}x)"


def pack_layers(layers: list) -> None:
    """Replace every layer's GEMM weights (layers.LayerWeights) by OneDNNLinear, biases packed in, and build the
    primitives of every ladder row count (oneDNN caches them by shape, so one layer's four GEMMs stand for all
    layers: same shapes)."""
    replace_layer_gemms(layers, OneDNNLinear)
    if layers:
        lw = layers[0]
        for g in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down):
            g.warm()


def gflops(n: int = 1024, seconds: float = 1.0, dtype: torch.dtype = torch.float32) -> float:
    """Measured n x n GEMM rate through oneDNN (packed weight), GFLOP/s at the current thread count: the
    counterpart of hardware.matmul_gflops, so a compute floor uses the faster of the two libraries."""
    from workbench.hardware import gemm_rate

    x, fast = torch.randn(n, n, dtype=dtype), OneDNNLinear(torch.randn(n, n, dtype=dtype))
    return gemm_rate(lambda: fast(x), 2 * n**3, seconds)
