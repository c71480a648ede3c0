"""`quantize="int8"`: the torch engine's layer GEMMs on PyTorch's dynamic int8 kernel.

What runs: `torch.ops.quantized.linear_dynamic` (fbgemm / x86 / onednn, whichever
`torch.backends.quantized.engine` is; the same kernel behind `torch.ao.nn.quantized.dynamic.Linear`).
- Weights: quantized once at load, symmetric per output channel: scale_j = max_i |w_ji| / 127, so each
  weight is off by at most scale_j / 2 = max_i |w_ji| / 254.
- Activations: quantized by the kernel on every call, one affine scale for the whole input (all rows
  of the GEMM), over [min(x, 0), max(x, 0)] in 256 levels where the CPU has AVX512-VNNI, else 128
  (`reduce_range`, which PyTorch's own dynamic Linear always sets: without VNNI the kernels sum u8 x s8
  pairs in saturating int16, and 7-bit activations keep those sums in range; VNNI accumulates in int32).
  Each activation is off by at most half a step, (max - min) / 510 (or / 254). The full 8 bits halve
  the logits' error on the benchmark's random models (25m: 14% vs 27% RMS).
- Products are summed exactly in int32 and rescaled to float32, so a GEMM's result is the exact
  product of the two rounded operands up to float32 rounding (tests/test_torch_variants.py checks that).

Which GEMMs: qkv, o, gate_up and down of every layer (over 99% of the weight FLOPs). The lm_head stays
float32: it is 0.4-0.7% of a beam request's FLOPs at the benchmark sizes (floorbench's lm_head row), and
int8 there measured ~2 ms less decode time on a ~145 ms 25m request (one thread), inside the run-to-run
noise, for rounding that lands directly on the log-probs the beams are ranked by. The embeddings, norms,
RoPE, attention and softmax are float32 as well.

Consequences: results are float32 results of a slightly different model (every layer weight and GEMM
input rounded), not float32 rounding. On the benchmark's random 25m model (8 layers) the logits are
~14% RMS off float32 (bfloat16: ~2.5%) and the Spearman correlation of the SIDs' sequence scores with
float32 is ~0.99 (bfloat16: 0.999): the speed costs ranking quality, which only a trained checkpoint's
test users can price (workbench/perf/variant_quality.py). A row's activation scale is shared with its batch mates, so
batch independence holds only up to int8 rounding (hence no `batch_invariant` with int8); float32
activations only (the kernel refuses bfloat16), CPU only. model.check_options says so up front.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from workbench.engines.torch.layers import replace_layer_gemms
from workbench.hardware import has_cpu_flag

# 7-bit activations unless the CPU has AVX512-VNNI (see the module docstring)
ACT_REDUCE_RANGE = not has_cpu_flag("avx512_vnni")


class Int8Linear:
    """x @ w.T + b with `w` [out, in] int8 per output channel, packed once; `x` quantized per call."""

    def __init__(self, w: Tensor, b: Tensor | None = None):
        w = w.detach().float().contiguous()
        # symmetric per channel; a zero row keeps a positive scale (any scale quantizes it exactly)
        self.scales = (w.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        with warnings.catch_warnings():
            # torch 2.13 deprecates creating quantized tensors (pytorch#184982), yet linear_prepack takes
            # nothing else; the packed weight is all the forward keeps
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            qw = torch.quantize_per_channel(w, self.scales.double(), torch.zeros(w.shape[0], dtype=torch.long),
                                            axis=0, dtype=torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(qw, None if b is None else b.detach().float())
        self.shape = tuple(w.shape)

    def __call__(self, x: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, ACT_REDUCE_RANGE)

    def numel(self) -> int:
        """Weights it multiplies by (as `Tensor.numel` of the float weight: the FLOP count reads it)."""
        return self.shape[0] * self.shape[1]

    def dequantized(self) -> tuple[Tensor, Tensor | None]:
        """(weight, bias) in float32 as the kernel multiplies them (the int8 weights times their scales)."""
        qw, b = torch.ops.quantized.linear_unpack(self.packed)
        return qw.dequantize(), b


def quantize_layers(layers: list) -> None:
    """Replace every layer's GEMM weights (layers.LayerWeights) by Int8Linear, biases packed in."""
    replace_layer_gemms(layers, Int8Linear)
