"""`compile=True`: the torch engine's per-layer elementwise work as fused torch.compile kernels.

What is compiled: the three pure functions of `layers.LayerOps` (q/k RMSNorm + RoPE on the qkv
GEMM's output, residual add + the next RMSNorm, silu(gate) * up), each with the inductor backend
(C++ kernels on CPU, built with the system compiler). Each call then runs one fused loop instead of
~2-12 eager kernels with their float32 round trips. The GEMMs (`layers.linear`, with its batch
invariance padding) and the attention stay eager: BLAS / SDPA already run them as single kernels.

Shapes: only the row count varies between forwards (prompt tokens + beams + candidates); the
warm-up marks that dimension dynamic, so one kernel per function serves every row count >= 2 and
a second one the 1-row forwards (torch specializes size 1). Everything else (hidden size, heads,
head dim, dtype) stays static, which lets inductor vectorize with known sizes. `dynamic=True` would
make those symbolic too (measured on the 25m shapes: ~20% slower fused kernels at 512 rows and about
twice the per-call overhead at 1 row). No forward after the warm-up recompiles
(tests/test_torch_variants.py counts the graphs).

Cost: each compiled call has a fixed overhead (guards and wrappers, ~10-20 us on one thread) where the
eager ops of a few rows take a few us, so the gain is in prefill-sized row counts; 4 calls per layer.
Measured (`workbench microbench --floor --threads 1`, 2-core AMD EPYC with AVX512-BF16, no AMX, shared
with training jobs): within the noise, e.g. 25m bfloat16 166-170 ms eager vs 168 ms compiled per beam
request. The fused kernels save ~0.5 ms per layer of a 512-row prefill at the 25m shapes (~4 ms a
request); that is a larger share where the GEMMs are faster (AMX bfloat16).

Warm-up: at construction (not inside a measured request), real forwards through the prefill and the
shared-prompt (decode / scoring) path, with several rows and with one; the time is printed. Where
compiling fails (no C++ compiler, a platform inductor does not support) the engine warns once with
the reason and runs the eager functions: the same results, the eager speed.

Numerics: the compiled kernels keep intermediates in float32 and round once on store, where eager
bfloat16 rounds after every op; reductions may sum in another order. Both stay within the derived
rounding bounds of workbench/engines/numerics.py (tests/test_torch_variants.py).
"""

from __future__ import annotations

import sys
import time
import warnings

import torch
from torch import Tensor

from workbench.engines.torch.layers import EAGER_OPS, ROW_ARGS, LayerOps
from workbench.engines.torch.segments import KVLayout, PrefillSegment, pad_prompt_kv, score_segment

# Every model shape and dtype a process compiles adds graphs to the same functions' caches (2 each: rows >= 2
# and 1 row). torch's default limit (8) would silently fall back to eager after a few engines in one process
# (the tests build several); this only raises the limit.
RECOMPILE_LIMIT = 64


def compile_ops(lm) -> LayerOps:
    """The compiled LayerOps, warmed up on `lm` (the model.FastLM being built, which calls this at load: its
    forward compiles them); EAGER_OPS and a one-line warning when compiling fails here."""
    t0 = time.perf_counter()
    try:
        import torch._dynamo

        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
        # dynamic=False: static shapes except the row dimension, which the warm-up marks dynamic (module doc)
        ops = LayerOps(*(torch.compile(f, dynamic=False) for f in EAGER_OPS))
        _warm_up(lm, ops)
    except Exception as e:  # noqa: BLE001 - any failure to compile: run eager and say why
        warnings.warn(f"torch engine: compile=True failed, running eager ({_reason(e)})", RuntimeWarning,
                      stacklevel=3)
        return EAGER_OPS
    finally:
        lm.ops = EAGER_OPS
    print(f"[torch engine] compiled the fused layer ops in {time.perf_counter() - t0:.1f} s "
          "(warm-up: prefill and shared-prompt forwards, several rows and one)", file=sys.stderr, flush=True)
    return ops


def _warm_up(lm, ops: LayerOps) -> None:
    """Compile `ops` through `lm`'s real forward: a prefill of two prompts (rows >= 2, marked dynamic),
    then a shared-prompt forward of one row (the 1-row kernels)."""
    lm.ops = LayerOps(*(_rows_dynamic(f, rows) for f, rows in zip(ops, ROW_ARGS)))
    x = torch.randn(5, lm.hidden, dtype=lm.dtype, device=lm.device)
    seg = PrefillSegment([2, 3])
    lm.forward(x, [seg])
    lens = torch.as_tensor([3], device=lm.device)
    prompt_kv = pad_prompt_kv([[kv[1] for kv in seg.kv]], lens, KVLayout.of(lm, lm.device))
    shared, _ = score_segment([[[5]]], prompt_kv, lens, lm.device)
    lm.ops = ops  # the 1-row call must not mark (size 1 cannot be dynamic)
    lm.forward(x[:1], [shared])


def _rows_dynamic(fn, rows: tuple[int, ...]):
    """`fn` with dim 0 of its row arguments (positions `rows`, layers.ROW_ARGS; not the weights, whose
    first dim is heads or hidden) marked dynamic before the call: only during the warm-up, the compiled graphs
    then accept any rows."""

    def call(*args):
        for i in rows:
            if args[i].shape[0] > 1:
                torch._dynamo.mark_dynamic(args[i], 0)
        return fn(*args)

    return call


def _reason(e: BaseException) -> str:
    """The innermost cause's type and first line: inductor wraps the compiler's error in its own."""
    while e.__cause__ is not None:
        e = e.__cause__
    line = next((ln for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {line[:200]}"
