"""A hand-written forward for Qwen3 / Llama decoders, built for shared-prefix work.

Why not call the HF module: the engine needs attention layouts HF does not offer. One forward runs
any mix of *segments* over one flat set of token rows (the linear layers, which dominate the cost,
see every row at once):

- `PrefillSegment`: whole prompts, causal attention per prompt (`causal_attention`: query blocks of
  matmuls for CPU prompts of BLOCKED_MIN_LEN tokens or more, torch SDPA otherwise); their K/V come back per
  layer and become the prompts' KV caches.
- `SharedSegment`: R groups, each with a prompt KV cache that is *shared* by S streams (the beams
  of a request, or the candidates of a score request). Every stream has its own short KV (earlier
  generated tokens) plus Lq new query tokens. A query attends to [its group's prompt KV | its own
  stream's KV up to itself]; the prompt KV is never copied per stream. Positions continue after
  the prompt for every stream (so candidates restart at the same position).

Numerics follow the HF modules (RMSNorm in float32, RoPE from the model's own rotary module,
`head_dim ** -0.5` scaling) so fp32 results match `transformers` to ~1e-6.

Shapes: H query heads, Hkv KV heads, g = H // Hkv, D head dim; query head h uses KV head h // g.

What a layer is made of (norms, GEMM wrappers, the elementwise ops, the weights) lives in layers.py and the
segments in segments.py, both below this module, so the variants it applies at load take them from there.

Two opt-in variants, both off by default (the default forward is the plain eager one):
- `compile=True`: the elementwise work between a layer's GEMMs and its attention (`LayerOps`: q/k
  norm + RoPE, residual add + RMSNorm, silu * mul) runs as torch.compile (inductor) kernels,
  built and warmed up at construction (fused.py); the GEMMs and the attention stay as they are.
- `quantize="int8"`: the layer GEMMs (qkv, o, gate_up, down) run PyTorch's dynamic int8 kernel
  (int8.py); embeddings, norms, attention and the lm_head stay in float32.

One choice made per machine (`gemm="auto"`, the default): the layer GEMMs run on oneDNN with their weights
packed once, in float32 where it measures clearly faster than `F.linear` at load (2.2-2.6x on an AMD EPYC
Zen 5), in bfloat16 wherever oneDNN has a bfloat16 kernel (the same results as `F.linear`; the layer GEMMs
of a beam-30 decode step 1.45x faster there; onednn.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from workbench.engines.torch import onednn
from workbench.engines.torch.layers import EAGER_OPS, LayerWeights, linear, rms_norm
from workbench.engines.torch.options import QUANTIZE_MODES
from workbench.engines.torch.segments import PrefillSegment, SharedSegment
from workbench.errors import UsageError

SUPPORTED_MODEL_TYPES = ("qwen3", "llama")


class UnsupportedModel(ValueError):
    pass


class UnsupportedOption(UsageError, ValueError):
    """An engine option (or combination) this forward cannot run, e.g. int8 with bfloat16."""

# Query rows per block of the CPU causal attention: 32/64/128 measured at prompt 512, head dim 64, 1 thread
# (AMD EPYC, AVX512-BF16): 64 best or within 15% of best in float32 and bfloat16; 256 slower (scores outgrow L2).
ATTN_BLOCK = 64
# Shorter prompts keep SDPA: at 64-128 tokens its one call beat the blocks' per-call overhead (SDPA 1.2-2.4x faster
# with 2-4 heads of 32, about even with 8 heads of 64; same CPU), at 512 the blocks won in every shape measured
# (0.34-0.96x SDPA's time). The study's SID prompts (~80 tokens) stay on SDPA; text prompts and the benchmark's 512 do not.
BLOCKED_MIN_LEN = 4 * ATTN_BLOCK


def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, block: int = ATTN_BLOCK) -> Tensor:
    """Causal attention of one prompt: q [H, L, D], k/v [Hkv, L, D] -> [Hkv, g, L, D] (query head h = kv h // g).

    Why not SDPA on CPU: its kernel ran this shape at ~45 GFLOP/s in both dtypes (prompt 512: 5.6 ms per layer
    float32, 5.9 bfloat16 on one AMD EPYC core), 2.5-10x under the matmul rate. Here each block of `block` query
    rows is two batched GEMMs over the keys up to its last row (no work above the diagonal beyond one
    block), the scale applied in the first GEMM (`alpha`), and a softmax: 3.7-4.6 ms float32, 2.6 bfloat16
    on the same core (4.0 before the scale moved into the GEMM and the bfloat16 softmax stopped going through a
    float32 copy, 2026-12-02). Numerics: float32 as SDPA (max |diff| to a float64 reference 1e-6 both); in
    bfloat16 the scores are stored in bfloat16 (CPU GEMMs have no float32 output for bfloat16 inputs), as in
    `transformers`' eager attention, ~5x SDPA's RMS error; numerics.py counts that rounding. The softmax
    computes in float32 for bfloat16 input (PyTorch's CPU kernel converts; its output equals softmax in
    float32 then one rounding, bit for bit: tests/test_torch_variants.py).
    """
    H, L, D = q.shape
    Hkv = k.shape[0]
    g = H // Hkv
    qg = q.reshape(Hkv, g, L, D)
    kt = k.transpose(-1, -2)
    out = q.new_empty(Hkv, g, L, D)
    above = torch.ones(block, block, dtype=torch.bool, device=q.device).triu_(1)
    none = q.new_empty(())  # baddbmm's input, ignored with beta=0
    for i0 in range(0, L, block):
        i1 = min(L, i0 + block)
        n = i1 - i0
        s = torch.baddbmm(none, qg[:, :, i0:i1].reshape(Hkv, g * n, D), kt[:, :, :i1], beta=0, alpha=scale)
        s = s.view(Hkv, g, n, i1)
        s[..., i0:].masked_fill_(above[:n, :n], float("-inf"))
        p = torch.softmax(s, dim=-1).view(Hkv, g * n, i1)
        out[:, :, i0:i1] = torch.bmm(p, v[:, :i1]).view(Hkv, g, n, D)
    return out


def logprob_dtype(device, dtype: torch.dtype) -> torch.dtype:
    """The dtype the log-softmax over the vocabulary runs in (and beam scores accumulate in).

    float64 on the CPU, as it always has: the results recorded so far (rankings, variant quality, the parity
    suite's float64 logic check) were computed so, and with it cumulative beam scores differ across batch
    compositions only by the logits' own rounding, not by float32 sums of ~-30; at a CPU's row counts it costs
    little. float32 on a GPU: float64 runs at 1/2 (H100-class) down to 1/64 (consumer parts) of the float32 rate
    there, and at the seeds' shape the full-vocabulary rows are large (500 candidates x 4 rows x 151,936 columns:
    2.4 GB in float64). What float32 changes is inside the derived bound (engines/numerics.py): the log-sum-exp
    over the vocabulary is one of the sums its path counts (the `vocab` term of `path_terms`), and a 5-token
    cumulative score adds ~5 float32 roundings of ~30 (1e-5), far below the bf16 bound the GPU runs under. A
    float64 model keeps float64 everywhere."""
    return torch.float64 if torch.device(device).type == "cpu" or dtype == torch.float64 else torch.float32


def check_options(dtype: torch.dtype, device, batch_invariant: bool, quantize: str | None) -> None:
    """UnsupportedOption, with what to do instead, for a `quantize` the forward cannot run."""
    if quantize is None:
        return
    if quantize not in QUANTIZE_MODES:
        raise UnsupportedOption(f"quantize={quantize!r} is not known; use one of {QUANTIZE_MODES} or None")
    why = []
    if dtype != torch.float32:  # dtype "auto" resolves to bfloat16 on CPUs with AMX / AVX512-BF16
        why.append(f"dtype {str(dtype).removeprefix('torch.')} (PyTorch's dynamic int8 linear takes float32 "
                   "activations only; use dtype float32)")
    if torch.device(device).type != "cpu":
        why.append(f"device {device} (the int8 kernels are CPU kernels; use device cpu)")
    if batch_invariant:
        why.append("batch_invariant=True (the activations' int8 scale is taken over all rows of a GEMM, so a row's "
                   "rounding depends on its batch mates by design)")
    if why:
        raise UnsupportedOption(f"quantize={quantize!r} cannot run with " + "; ".join(why))


class FastLM:
    """Weights of a Qwen3/Llama causal LM, re-laid out for fused matmuls, and the segment forward."""

    def __init__(self, hf_model, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 batch_invariant: bool = False, compile: bool = False, quantize: str | None = None,
                 gemm: str = "auto"):
        """`compile`: fused elementwise kernels (fused.py; eager with a warning where compiling fails);
        `quantize="int8"`: dynamic int8 layer GEMMs (int8.py); `gemm`: the layer GEMMs' library,
        "auto" (packed oneDNN where it is faster, onednn.py), "default" (F.linear) or "onednn".
        See the module docstring."""
        cfg = hf_model.config
        self.config = cfg  # the source model's shape (FLOP counts read it: model/flops.py)
        self.batch_invariant = batch_invariant
        check_options(dtype, device, batch_invariant, quantize)
        self.quantize = quantize
        if cfg.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(
                f"the torch engine implements {SUPPORTED_MODEL_TYPES}, not {cfg.model_type!r}; use the hf engine"
            )
        if getattr(cfg, "use_sliding_window", False):
            raise UnsupportedModel("sliding-window attention is not implemented in the torch engine; use the hf engine")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise UnsupportedModel(f"activation {cfg.hidden_act!r} is not implemented (silu only)")
        self.device = torch.device(device)
        self.dtype = dtype
        self.logprob_dtype = logprob_dtype(self.device, dtype)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.group = self.n_heads // self.n_kv
        self.eps = cfg.rms_norm_eps
        self.hidden = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.scale = self.head_dim**-0.5
        rot = hf_model.model.rotary_emb
        self.inv_freq = rot.inv_freq.detach().float().to(self.device)
        self.rope_scaling = float(getattr(rot, "attention_scaling", 1.0))

        def t(x):
            return None if x is None else x.detach().to(device=self.device, dtype=dtype).contiguous()

        m = hf_model.model
        self.embed = t(m.embed_tokens.weight)
        self.norm = t(m.norm.weight)
        self.lm_head = t(hf_model.lm_head.weight)
        self.layers: list[LayerWeights] = []
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            bias = a.q_proj.bias
            self.layers.append(
                LayerWeights(
                    ln1=t(layer.input_layernorm.weight),
                    wqkv=t(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),
                    bqkv=None if bias is None else t(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])),
                    qk_norm=t(torch.cat([a.q_norm.weight.expand(self.n_heads, -1),
                                         a.k_norm.weight.expand(self.n_kv, -1)])) if hasattr(a, "q_norm") else None,
                    wo=t(a.o_proj.weight),
                    bo=t(a.o_proj.bias),
                    ln2=t(layer.post_attention_layernorm.weight),
                    w_gate_up=t(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                    w_down=t(mlp.down_proj.weight),
                )
            )
            if getattr(mlp.gate_proj, "bias", None) is not None:
                raise UnsupportedModel("MLP biases are not implemented in the torch engine; use the hf engine")
        # the source model's own parameters (tied output layer counted again, as the forward multiplies by it);
        # not the re-laid-out weights, whose q/k norms are repeated per head
        self._n_params = (self.embed.numel() + self.norm.numel() + self.lm_head.numel()
                          + sum(p.numel() for p in m.layers.parameters()))
        if quantize == "int8":
            from workbench.engines.torch.int8 import quantize_layers

            quantize_layers(self.layers)
        self.gemm, self.gemm_why = self._choose_gemm(gemm)
        if self.gemm == "onednn":
            onednn.pack_layers(self.layers)
        # oneDNN's lm_head (bfloat16 F.linear) at the GEMMs' fixed row counts, built now (onednn.py, "Row counts")
        self.lm_head_ladder = onednn.lm_head_on_ladder(self.device, dtype, batch_invariant)
        if self.lm_head_ladder:
            onednn.warm_ladder(self._lm_head, self.hidden, dtype)
        self.ops = EAGER_OPS
        if compile:
            from workbench.engines.torch.fused import compile_ops

            self.ops = compile_ops(self)  # warmed up here; EAGER_OPS (and a warning) if compiling fails
        self.compiled = self.ops is not EAGER_OPS

    def _choose_gemm(self, mode: str) -> tuple[str, str]:
        """The layer GEMMs' library ("default" or "onednn") and why; the weights are still plain tensors here."""
        fixed = ("quantize='int8' has its own GEMM kernel" if self.quantize else
                 "batch_invariant=True pins F.linear's row blocks" if self.batch_invariant else None)
        if fixed is not None:
            if mode == "onednn":
                raise UnsupportedOption(f"gemm='onednn' cannot run with {fixed}; use gemm='auto'")
            return "default", fixed
        return onednn.choose(mode, self.layers[0].w_gate_up, self.device, self.dtype)

    # ---- sizes -------------------------------------------------------------------------------
    def n_params(self) -> int:
        return self._n_params

    def kv_bytes_per_token(self) -> int:
        return 2 * len(self.layers) * self.n_kv * self.head_dim * self.embed.element_size()

    def flops_per_token(self, context: int = 0) -> float:
        """Matmul FLOPs of one token (weights, lm_head excluded) plus attention over `context` keys."""
        w = sum(lw.wqkv.numel() + lw.wo.numel() + lw.w_gate_up.numel() + lw.w_down.numel() for lw in self.layers)
        return 2.0 * w + 4.0 * len(self.layers) * self.n_heads * self.head_dim * context

    # ---- pieces ------------------------------------------------------------------------------
    def embed_ids(self, ids: Tensor) -> Tensor:
        return F.embedding(ids.to(self.device), self.embed)

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin) [N, 1, D] of HF's rotary embedding at `positions`, sin's first half negated (qk_norm_rope)."""
        freqs = positions.to(self.device).float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scaling).to(self.dtype)[:, None, :]  # [N, 1, D]
        sin = (emb.sin() * self.rope_scaling).to(self.dtype)
        sin[:, : sin.shape[-1] // 2].neg_()
        return cos, sin[:, None, :]

    def _lm_head(self, h: Tensor) -> Tensor:
        return F.linear(h, self.lm_head)

    def logits(self, h: Tensor) -> Tensor:
        """Final-normed hidden rows [N, hidden] -> logits [N, vocab] (in the model dtype)."""
        if self.lm_head_ladder:
            return onednn.on_ladder(self._lm_head, h)
        return linear(h, self.lm_head, blocked=self.batch_invariant)

    def log_probs(self, h: Tensor) -> Tensor:
        """Log-probs [N, vocab] over the whole vocabulary, in `logprob_dtype` (float64 on the CPU, float32 on a GPU)."""
        return torch.log_softmax(self.logits(h).to(self.logprob_dtype), dim=-1)

    # ---- the forward -------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, x: Tensor, segments: list, positions: Tensor | None = None) -> Tensor:
        """x: [N, hidden] input embeddings of all rows, segment after segment. Returns final-normed rows."""
        if positions is None:
            positions = torch.cat([self._positions(s) for s in segments])
        cos, sin = self.rope(positions)
        for seg in segments:
            if isinstance(seg, PrefillSegment):
                seg.kv = []
            else:
                seg.prepare()
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        ops, eps, blocked = self.ops, self.eps, self.batch_invariant
        h = rms_norm(x, self.layers[0].ln1, eps)
        for li, lw in enumerate(self.layers):
            qkv = linear(h, lw.wqkv, lw.bqkv, blocked=blocked)
            qk = ops.qk_norm_rope(qkv[:, : (H + Hkv) * D].view(-1, H + Hkv, D), lw.qk_norm, cos, sin, eps)
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, (H + Hkv) * D :].view(-1, Hkv, D)
            outs, off = [], 0
            for seg in segments:
                n = seg.n_rows
                sl = slice(off, off + n)
                if isinstance(seg, PrefillSegment):
                    outs.append(self._attend_prefill(seg, q[sl], k[sl], v[sl]))
                else:
                    outs.append(self._attend_shared(seg, li, q[sl], k[sl], v[sl]))
                off += n
            o = outs[0] if len(outs) == 1 else torch.cat(outs)
            x, h = ops.add_norm(x, linear(o, lw.wo, lw.bo, blocked=blocked), lw.ln2, eps)
            gu = linear(h, lw.w_gate_up, blocked=blocked)
            # the next layer's input norm (the final norm after the last layer) joins this residual add
            nxt = self.layers[li + 1].ln1 if li + 1 < len(self.layers) else self.norm
            x, h = ops.add_norm(x, linear(ops.silu_mul(gu), lw.w_down, blocked=blocked), nxt, eps)
        return h

    def _positions(self, seg) -> Tensor:
        if isinstance(seg, PrefillSegment):
            return torch.cat([torch.arange(n) for n in seg.lengths]).to(self.device)
        return seg.positions()

    def _attend_prefill(self, seg: PrefillSegment, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # One causal attention per prompt (rows of a prompt are consecutive): the result of a prompt
        # never depends on what else is in the batch.
        H, D = self.n_heads, self.head_dim
        outs, kvs, off = [], [], 0
        for L in seg.lengths:
            qp, kp, vp = (z[off : off + L].transpose(0, 1) for z in (q, k, v))  # [heads, L, D]
            # the prompt's own K/V (read once per query block below; kept as its KV cache, so not as views that
            # would keep this forward's whole q|k and qkv outputs alive)
            kp, vp = kp.contiguous(), vp.contiguous()
            if self.device.type == "cpu" and L >= BLOCKED_MIN_LEN:
                o = causal_attention(qp, kp, vp, self.scale).view(H, L, D)
            else:
                o = F.scaled_dot_product_attention(
                    qp[None], kp[None], vp[None], is_causal=True, scale=self.scale, enable_gqa=self.group > 1
                )[0]  # [H, L, D]
            kvs.append((kp, vp))
            outs.append(o.transpose(0, 1).reshape(L, H * D))
            off += L
        seg.kv.append(kvs)
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _attend_shared(self, seg: SharedSegment, li: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        H, Hkv, D, g = self.n_heads, self.n_kv, self.head_dim, self.group
        R, S, Lq = seg.R, seg.S, seg.Lq
        tp = seg.t_past
        T = tp + Lq
        if seg._in_order:  # rows are the grid: the new K/V follow every stream's past
            own_k, own_v = (z.view(R, S, Lq, Hkv, D).transpose(2, 3) for z in (k, v))  # [R, S, Hkv, Lq, D]
            if tp:
                pk, pv = seg.past_kv[li]
                own_k, own_v = torch.cat([pk, own_k], dim=3), torch.cat([pv, own_v], dim=3)
            else:
                own_k, own_v = own_k.contiguous(), own_v.contiguous()
            qg = q
        else:
            own_k = k.new_zeros(R, S, Hkv, T, D)
            own_v = v.new_zeros(R, S, Hkv, T, D)
            if tp:
                pk, pv = seg.past_kv[li]
                own_k[:, :, :, :tp] = pk
                own_v[:, :, :, :tp] = pv
            own_k[seg.r_idx, seg.s_idx, :, seg._write_pos] = k
            own_v[seg.r_idx, seg.s_idx, :, seg._write_pos] = v
            qg = q.new_zeros(R * S * Lq, H, D)
            qg[seg._grid] = q
        seg.own_kv.append((own_k, own_v))
        kP, vP = seg.prompt_kv[li]  # [R, Hkv, Pmax, D]
        pmax = kP.shape[2]
        # [R, S, Lq, Hkv, g, D] -> [R, Hkv, S, g, Lq, D]
        qg = qg.view(R, S, Lq, Hkv, g, D).permute(0, 3, 1, 4, 2, 5).reshape(R, Hkv, S * g * Lq, D)
        s1 = torch.matmul(qg, kP.transpose(-1, -2)).view(R, Hkv, S, g * Lq, pmax)
        ok = own_k.permute(0, 2, 1, 3, 4)  # [R, Hkv, S, T, D]
        ov = own_v.permute(0, 2, 1, 3, 4)
        s2 = torch.matmul(qg.view(R, Hkv, S, g * Lq, D), ok.transpose(-1, -2))  # [R, Hkv, S, g Lq, T]
        s = torch.cat([s1, s2], dim=-1).to(torch.promote_types(q.dtype, torch.float32)).mul_(self.scale)
        if seg._mask is None:
            dev = q.device
            kp_ok = torch.arange(pmax, device=dev)[None, :] < seg.prompt_len[:, None]  # [R, Pmax]
            lim = seg.past_len[:, None] + torch.arange(Lq, device=dev)[None, :]  # [R, Lq]
            own_ok = torch.arange(T, device=dev)[None, None, :] <= lim[:, :, None]  # [R, Lq, T]
            m = torch.cat([kp_ok[:, None, :].expand(R, Lq, pmax), own_ok], dim=-1)  # [R, Lq, Pmax+T]
            # the hidden keys [R, 1, 1, 1, Lq, Pmax+T], or False where every key is visible (a decode step of
            # equal-length prompts: the masking pass would change nothing, ~0.1 ms per layer at beam 30, prompt 512)
            seg._mask = False if bool(m.all()) else ~m[:, None, None, None]
        s = s.view(R, Hkv, S, g, Lq, pmax + T)
        if seg._mask is not False:
            s.masked_fill_(seg._mask, float("-inf"))
        p = torch.softmax(s, dim=-1).to(q.dtype)
        p1 = p[..., :pmax].reshape(R, Hkv, S * g * Lq, pmax)
        p2 = p[..., pmax:].reshape(R, Hkv, S, g * Lq, T)
        o = torch.matmul(p1, vP).view(R, Hkv, S, g, Lq, D) + torch.matmul(p2, ov).view(R, Hkv, S, g, Lq, D)
        o = o.permute(0, 2, 4, 1, 3, 5).reshape(R * S * Lq, H * D)
        return o if seg._in_order else o[seg._grid]
