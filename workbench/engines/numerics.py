"""How far two correct evaluations of the same model may differ: a rounding bound derived from sizes.

Why tests need this: BLAS and the attention kernels choose their kernel, blocking and thread
split by the number of rows they are given, and the choice differs between CPUs (AVX2 vs
AVX-512/AMX) and thread counts. Two *correct* evaluations of the same request, e.g. alone and
among 63 batch mates, may therefore sum the same products in a different order. Exact equality
holds on one machine and fails on the next (the suite failed on an AMX Xeon for a 1.1e-5
difference that was 0 on an AVX2 EPYC), so tests compare against this bound instead.

Derivation (first order, probabilistic rounding analysis: Higham & Mary, SIAM J. Sci. Comput.
41(5), 2019, Thm 3.1). A sum of n products computed in any order has an error of at most
`lam * sqrt(n) * u * sum|x_i y_i|` with probability >= 1 - 2 exp(-lam^2 / 2) (u: unit roundoff,
2^-24 in float32, 2^-53 in float64; lam = 5 makes a single exceedance ~1e-5 likely). Errors of
the sums along the path from the input to one log-prob add in quadrature, so with

    n = layers * (hidden + kv_len + heads * head_dim + hidden + intermediate) + hidden + vocab

terms along that path (q/k/v, attention over kv_len positions, o, gate/up, down, lm_head, the
log-sum-exp over the vocabulary), one evaluation's log-prob is within `lam * sqrt(n) * u * Z`
of the exact value, Z the largest |logit| (the scale of the sums; RMSNorm keeps the hidden
states at that scale from layer to layer). Two evaluations differ by at most twice that; a
log-prob is a difference of two such quantities (z_y - logsumexp z): another factor 2; a beam's
cumulative log-prob adds `steps` of them.

Half precision (bfloat16, float16) is another error model: the products are summed in float32
accumulators (CPU and GPU GEMM and attention kernels alike), and the dominant error is the rounding of
each *stored* activation to the half type, a relative error of at most u per element (2^-8 in
bfloat16). Along the path to one logit there are r = 11 * layers + 3 such stores (per layer: the
normed input, q/k/v, the attention scores and probabilities (the torch engine's CPU attention stores
both, as `transformers`' eager attention does), attention output, o, the residual sum, the second normed
input, gate/up, the activation product, down, the second residual, counting the two residual stores as
one as before; then the embedding, the final norm and the logits),
each independent, so in quadrature one evaluation is within `lam * sqrt(r) * u * Z`; the same
factors 2, 2 and `steps` follow. This bound is loose (Z is the largest logit, not the typical one):
in bfloat16 it catches a wrong position, a leak across streams or a lost soft token (moves of whole
logits), not small numeric slips.

    bound = steps * 2 * 2 * lam * sqrt(n) * u * Z

For the tests' tiny models (hidden 64, 2 layers, vocab ~450, Z ~ 10-30) this is ~1e-3 in
float32 (observed differences: 0 to 1.1e-5) and ~1e-12 in float64: a batch mate that changes a
result through the engine's logic (a leak across streams, a wrong position, a padding error)
moves it by far more than either (see test_engine_parity's fault-injection note).
"""

from __future__ import annotations

import math

UNIT_ROUNDOFF = {"float32": 2.0**-24, "float64": 2.0**-53, "bfloat16": 2.0**-8, "float16": 2.0**-11}
LAMBDA = 5.0


def path_terms(config, kv_len: int) -> int:
    """n: the products summed along the path from the input to one log-prob (see the module doc)."""
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    h, inter = int(config.hidden_size), int(config.intermediate_size)
    per_layer = h + int(kv_len) + heads * head_dim + h + inter
    return int(config.num_hidden_layers) * per_layer + h + int(config.vocab_size)


HALF = ("bfloat16", "float16")  # stored in half precision, accumulated in float32


def stored_roundings(config) -> int:
    """r: the half-precision stores along the path to one logit (see the module doc)."""
    return 11 * int(config.num_hidden_layers) + 3


def logprob_bound(config, kv_len: int, steps: int, max_abs_logit: float, dtype: str = "float32") -> float:
    """Largest difference two correct evaluations of a `steps`-token cumulative log-prob may show."""
    u = UNIT_ROUNDOFF[dtype]
    terms = stored_roundings(config) if dtype in HALF else path_terms(config, kv_len)
    one = LAMBDA * math.sqrt(terms) * u * float(max_abs_logit)
    return int(steps) * 2 * 2 * one


def engine_bound(engine, prompts, steps: int, dtype: str = "float32") -> float:
    """`logprob_bound` for `engine`'s checkpoint over `prompts` (engine Prompts), Z read off their logits."""
    z = max(float(engine.prompt_logits(p).float().abs().max()) for p in prompts)
    kv_len = max(len(p.token_ids) for p in prompts) + int(steps)
    return logprob_bound(engine.checkpoint.model.config, kv_len, steps, z, dtype)
