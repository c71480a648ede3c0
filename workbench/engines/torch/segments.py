"""The row layouts one forward of the torch engine runs, and how a step's requests are laid out in them.

`PrefillSegment` (whole prompts) and `SharedSegment` (streams over a shared prompt KV: the beams of a decode
step, the candidates of a score pass) are what `model.FastLM.forward` takes (see model.py for the attention
over each); `pad_prompt_kv`, `pad_own_kv`, `decode_segment` and `score_segment` build them from the cached KV
of a batch of requests, and `PromptKVBuffer` keeps the decoding requests' padded prompt KV from step to step. The
engine and the compile variant's warm-up (fused.py) both build segments here.

torch is imported inside the functions: importing the engine module (for its capabilities) must not
import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class PrefillSegment:
    """Whole prompts laid out consecutively (no padding) in the row batch."""

    lengths: list[int]
    # filled by the forward: per layer, per prompt (k, v), each [Hkv, L, D]
    kv: list[list[tuple[Tensor, Tensor]]] = field(default_factory=list)

    @property
    def n_rows(self) -> int:
        return sum(self.lengths)


@dataclass
class SharedSegment:
    """R groups x S streams x Lq query tokens attending to a shared prompt KV plus their own KV.

    Rows are the valid (r, s, i) slots in any order given by `r_idx`, `s_idx`, `i_idx`.
    `prompt_kv[layer] = (k, v)` with k [R, Hkv, Pmax, D]; `prompt_len` [R].
    `past_kv[layer] = (k, v)` with k [R, S, Hkv, Tpast, D] (may be None); `past_len` [R]: the own
    tokens of every stream of group r already cached (0 for scoring).
    """

    R: int
    S: int
    Lq: int
    r_idx: Tensor
    s_idx: Tensor
    i_idx: Tensor
    prompt_kv: list[tuple[Tensor, Tensor]]
    prompt_len: Tensor
    past_kv: list[tuple[Tensor, Tensor]] | None
    past_len: Tensor
    # filled by the forward: per layer (k, v) [R, S, Hkv, Tpast + Lq, D] = past + the new tokens
    own_kv: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    # set by `prepare`, once per forward (every layer reads them)
    _mask: Tensor | bool | None = None  # the hidden keys, built by the first layer; False: none hidden
    _grid: Tensor | None = None  # [rows] each row's slot in the [R, S, Lq] grid
    _write_pos: Tensor | None = None  # [rows] where each row's K/V goes in its stream's own KV (rows not in order)
    _in_order: bool = False  # every slot of the grid is a row, in grid order, and every stream's past is t_past long

    @property
    def n_rows(self) -> int:
        return int(self.r_idx.numel())

    def prepare(self) -> None:
        """Before a forward: the per-row indices every layer uses, and whether the rows fill the grid in order with
        one past length (a decode step of requests of one beam width, in step; a score pass over equal-length
        candidates). Then the attention appends the new K/V and takes the rows as they are, where otherwise it
        scatters rows into a zeroed grid and gathers them back: fewer ops per layer, the same values."""
        import torch

        self.own_kv, self._mask = [], None
        self._grid = (self.r_idx * self.S + self.s_idx) * self.Lq + self.i_idx
        n = self.R * self.S * self.Lq
        self._in_order = (self.n_rows == n and bool((self.past_len == self.t_past).all())
                          and bool((self._grid == torch.arange(n, device=self._grid.device)).all()))
        self._write_pos = None if self._in_order else self.past_len[self.r_idx] + self.i_idx

    @property
    def t_past(self) -> int:
        return 0 if self.past_kv is None else int(self.past_kv[0][0].shape[3])

    def positions(self) -> Tensor:
        return self.prompt_len[self.r_idx] + self.past_len[self.r_idx] + self.i_idx


# Prompt KV of a decode/score batch is padded to a multiple of this many positions (see pad_prompt_kv).
PROMPT_KV_BUCKET = 128


@dataclass(frozen=True)
class KVLayout:
    """Shape, dtype and device of the model's KV cache: what padding a batch's KV needs to know."""

    n_layers: int
    n_kv: int  # KV heads (Hkv)
    head_dim: int  # D
    dtype: Any
    device: Any

    @classmethod
    def of(cls, lm, device) -> "KVLayout":
        return cls(len(lm.layers), lm.n_kv, lm.head_dim, lm.dtype, device)


def pad_prompt_kv(prompt_kvs: Sequence[list], lens, kv: KVLayout) -> list:
    """Per layer (k, v) [R, Hkv, Pmax, D]: request r's prompt KV `prompt_kvs[r][layer]` ([Hkv, P_r, D]
    each) zero-padded; Pmax is max(`lens`) rounded up to a multiple of PROMPT_KV_BUCKET."""
    import torch

    # Pad to a fixed bucket, not to the batch's longest prompt: the softmax and p@V reductions then
    # run over the same length alone or in any batch, so results do not depend on batch mates.
    pmax = _bucket(lens.tolist())
    out = []
    for li in range(kv.n_layers):
        kP = torch.zeros(len(prompt_kvs), kv.n_kv, pmax, kv.head_dim, dtype=kv.dtype, device=kv.device)
        vP = torch.zeros_like(kP)
        for r, layers in enumerate(prompt_kvs):
            k, v = layers[li]
            kP[r, :, : k.shape[1]] = k
            vP[r, :, : v.shape[1]] = v
        out.append((kP, vP))
    return out


def _bucket(lens) -> int:
    return -(-max(int(x) for x in lens) // PROMPT_KV_BUCKET) * PROMPT_KV_BUCKET


class PromptKVBuffer:
    """The decoding requests' prompt KV, padded into one [R, Hkv, Pmax, D] tensor per layer, kept from step to step.

    A decode step attends every beam to its request's prompt KV, so the R requests' caches must sit in one tensor
    per layer. Built afresh whenever the decoding set changes (a request finishes, one joins: nearly every step
    under load) that copies every prompt's KV again: at 64 requests of 2,000 tokens on Qwen3-1.7B in bf16
    (115 kB of KV per token) some 15 GB per change. Here the rows sit in a buffer with as many spare rows behind
    them: requests leave from the front (the engine keeps the decoding set in admission order, and the oldest
    finish first) and join at the back, so the common change is a view of the survivors plus a copy of the
    newcomers alone. Anything else (a request leaving from the middle, a Pmax that grows or shrinks, no spare rows
    left) rebuilds it as before. What `get` returns is always what `pad_prompt_kv` would build for the same
    requests (same shape, same values, contiguous), so no result changes; `rows_copied` counts the prompts
    copied in, for the tests. Memory: the buffer holds twice the decoding set's rows (the spare half is what lets
    newcomers in without a copy of the rest), beside each request's own prompt KV, which a rebuild reads.
    """

    def __init__(self, kv: KVLayout):
        self.kv = kv
        self.keys: list = []  # the requests in rows [lo, hi), in order
        self.buf: list | None = None  # per layer (k, v) [capacity, Hkv, P, D]
        self.p = 0
        self.lo = self.hi = 0
        self.rows_copied = 0
        self.rebuilds = 0

    def get(self, keys: Sequence, prompt_kvs: Sequence[list], lens: Sequence[int]):
        """Per layer (k, v) [R, Hkv, Pmax, D] for requests `keys` (unique, hashable; in the order their rows are
        wanted) with prompt KV `prompt_kvs[r][layer]` ([Hkv, P_r, D] each) of lengths `lens`, and `lens` as a
        tensor on the device."""
        import torch

        keys, pmax = list(keys), _bucket(lens)
        lens_t = torch.as_tensor(list(lens), device=self.kv.device)
        start = self.keys.index(keys[0]) if self.buf is not None and keys[0] in self.keys else None
        if start is not None and pmax == self.p:
            kept = self.keys[start:]
            new = keys[len(kept):]
            fits = self.hi + len(new) <= self.buf[0][0].shape[0]
            if keys[: len(kept)] == kept and fits and not set(new) & set(self.keys):
                self._write(self.hi, prompt_kvs[len(kept):])
                self.lo, self.hi = self.lo + start, self.hi + len(new)
                self.keys = keys
                return self._view(), lens_t
        self._rebuild(keys, prompt_kvs, pmax)
        return self._view(), lens_t

    def clear(self) -> None:
        """Drop the buffer (its memory) and what it holds."""
        self.keys, self.buf, self.lo, self.hi = [], None, 0, 0

    def _rebuild(self, keys: list, prompt_kvs: Sequence[list], pmax: int) -> None:
        import torch

        kv, n = self.kv, len(keys)
        self.buf = None  # free the old rows before the new ones are allocated
        shape = (2 * n, kv.n_kv, pmax, kv.head_dim)
        self.buf = [(torch.zeros(shape, dtype=kv.dtype, device=kv.device),
                     torch.zeros(shape, dtype=kv.dtype, device=kv.device)) for _ in range(kv.n_layers)]
        self.p, self.lo, self.hi, self.keys = pmax, 0, n, keys
        self.rebuilds += 1
        self._write(0, prompt_kvs)

    def _write(self, row: int, prompt_kvs: Sequence[list]) -> None:
        """Copy the prompts' KV into rows `row`, `row + 1`, ... (never written since the buffer was made: zeros
        beyond each prompt's length, as pad_prompt_kv's padding)."""
        for i, layers in enumerate(prompt_kvs):
            for (kb, vb), (k, v) in zip(self.buf, layers):
                kb[row + i, :, : k.shape[1]] = k
                vb[row + i, :, : v.shape[1]] = v
        self.rows_copied += len(prompt_kvs)

    def _view(self) -> list:
        return [(k[self.lo : self.hi], v[self.lo : self.hi]) for k, v in self.buf]


def pad_own_kv(own_kvs: Sequence[list | None], past: Sequence[int], S: int, kv: KVLayout) -> list | None:
    """Per layer (k, v) [R, S, Hkv, max(past), D]: request r's generated-token KV `own_kvs[r][layer]`
    ([B_r, Hkv, past[r], D] each) zero-padded; None while no request has generated KV yet."""
    import torch

    tp = max(past)
    if not tp:
        return None
    if all(p == tp and layers[0][0].shape[0] == S for p, layers in zip(past, own_kvs)):  # nothing to pad: stack
        def stack(li: int, i: int):  # one request: a view, no copy
            parts = [layers[li][i] for layers in own_kvs]
            return parts[0][None] if len(parts) == 1 else torch.stack(parts)

        return [(stack(li, 0), stack(li, 1)) for li in range(kv.n_layers)]
    out = []
    for li in range(kv.n_layers):
        k = torch.zeros(len(own_kvs), S, kv.n_kv, tp, kv.head_dim, dtype=kv.dtype, device=kv.device)
        v = torch.zeros_like(k)
        for r, layers in enumerate(own_kvs):
            if past[r]:
                jk, jv = layers[li]
                k[r, : jk.shape[0], :, : past[r]] = jk
                v[r, : jv.shape[0], :, : past[r]] = jv
        out.append((k, v))
    return out


def decode_segment(tokens: Sequence, own_kvs: Sequence[list | None], prompt_kv: list, prompt_len, kv: KVLayout):
    """One decode step for R beam requests: the SharedSegment (one stream per live beam) and the
    [rows] last tokens to embed. `tokens[r]` [B_r, s_r] are request r's beams so far, `own_kvs[r]` their
    KV; `prompt_kv`, `prompt_len` as `pad_prompt_kv` builds them."""
    import torch

    from workbench.engines.torch.layers import MIN_ROWS

    dev = kv.device
    # at least MIN_ROWS streams: the attention matmuls then take the same BLAS path alone or batched
    S = max(MIN_ROWS, max(int(t.shape[0]) for t in tokens))
    past = [int(t.shape[1]) - 1 for t in tokens]
    r_idx = torch.cat([torch.full((int(t.shape[0]),), r, dtype=torch.long) for r, t in enumerate(tokens)])
    s_idx = torch.cat([torch.arange(int(t.shape[0])) for t in tokens])
    seg = SharedSegment(
        R=len(tokens), S=S, Lq=1, r_idx=r_idx.to(dev), s_idx=s_idx.to(dev), i_idx=torch.zeros_like(r_idx).to(dev),
        prompt_kv=prompt_kv, prompt_len=prompt_len, past_kv=pad_own_kv(own_kvs, past, S, kv),
        past_len=torch.as_tensor(past, device=dev),
    )
    return seg, torch.cat([t[:, -1] for t in tokens]).to(dev)


def score_segment(candidate_lists: Sequence[Sequence[Sequence[int]]], prompt_kv: list, prompt_len, device):
    """One pass over every candidate of R score requests: the SharedSegment (one stream per candidate,
    attending to its prompt and itself) and the [rows] candidate tokens to embed."""
    import torch

    from workbench.engines.torch.layers import MIN_ROWS

    S = max(MIN_ROWS, max(len(cands) for cands in candidate_lists))
    lq = max(len(c) for cands in candidate_lists for c in cands)
    r_idx, s_idx, i_idx, toks = [], [], [], []  # per row: request, candidate, position in it, token
    for r, cands in enumerate(candidate_lists):
        for s, c in enumerate(cands):
            n = len(c)
            r_idx += [r] * n
            s_idx += [s] * n
            i_idx += range(n)
            toks += c
    as_t = lambda z: torch.as_tensor(z, dtype=torch.long, device=device)  # noqa: E731
    R = len(candidate_lists)
    seg = SharedSegment(
        R=R, S=S, Lq=lq, r_idx=as_t(r_idx), s_idx=as_t(s_idx), i_idx=as_t(i_idx), prompt_kv=prompt_kv,
        prompt_len=prompt_len, past_kv=None, past_len=torch.zeros(R, dtype=torch.long, device=device),
    )
    return seg, as_t(toks)
