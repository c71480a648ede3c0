"""The torch engine's beam-search and scoring math, as pure functions over tensors.

Kept apart from engine.py so the search can be read (and checked) without the scheduler:
nothing here holds a thread, a queue, a future or a request; each function takes tensors (and the
catalog's prefix trie) and returns new ones. The engine's worker calls them once per forward and
keeps the per-request state. Covered: the segments (padded KV, stream layout) a decode or score
forward takes, the trie mask, beam selection, and reading beams and candidate scores off a forward.

Invariants the engine relies on:
- beams are ranked by raw cumulative log-prob (no length penalty, no EOS), best first;
- the trie mask only removes tokens (-inf); kept log-probs stay the model's full-vocabulary ones;
- a candidate's sequence score is the sum of its tokens' log-probs, the first token's read from
  the log-probs after the prompt.

torch is imported inside the functions: importing the engine module (for its capabilities) must
not import torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from workbench.engines.base import Beam

# Prompt KV of a decode/score batch is padded to a multiple of this many positions (see pad_prompt_kv).
PROMPT_KV_BUCKET = 128


@dataclass(frozen=True)
class Selection:
    """The beams kept by one `select_beams` step."""

    tokens: Any  # [B', s + 1] LongTensor: each kept beam's generated tokens
    cum: Any  # [B'] cumulative log-probs, best first
    parents: Any  # [B'] the row of the previous beams each kept beam extends


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
    pmax = -(-int(lens.max()) // PROMPT_KV_BUCKET) * PROMPT_KV_BUCKET
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

    from workbench.engines.torch.model import MIN_ROWS, SharedSegment

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

    from workbench.engines.torch.model import MIN_ROWS, SharedSegment

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


def banned_counts_by_depth(trie, banned_items: Sequence[int], depth: int) -> list:
    """Per depth, [1, n_nodes] banned leaves under each trie node (computed once per request)."""
    return [trie.banned_counts([list(banned_items)], d) for d in range(depth)]


def constraint_mask(trie, prefixes, vocab_size: int, device, banned_counts=None):
    """Allowed-token mask [B, vocab_size] after `prefixes` [B, t]; `banned_counts` [B, n_nodes] at depth t."""
    import torch

    m = trie.allowed_mask(prefixes.cpu(), banned_counts=banned_counts)
    if m.shape[1] < vocab_size:  # model vocab padded beyond the layout's tokens
        m = torch.nn.functional.pad(m, (0, vocab_size - m.shape[1]))
    return m.to(device)


def select_beams(tokens, cum, logp, beam_width: int) -> Selection | None:
    """Top `beam_width` (beam, token) continuations by cum + log-prob; None when none is finite.

    `tokens` [B, s] (None before the first token), `cum` [B], `logp` [B, vocab] with the tokens a constraint
    forbids already at -inf (`TorchEngine._allowed_logp`).
    """
    import torch

    cand = (cum[:, None] + logp).flatten()  # [B * vocab]
    top, idx = torch.topk(cand, min(beam_width, cand.numel()))
    keep = torch.isfinite(top)
    top, idx = top[keep], idx[keep]
    if top.numel() == 0:
        return None
    vocab = logp.shape[1]
    parents, toks = idx // vocab, idx % vocab
    prev = tokens if tokens is not None else torch.zeros(1, 0, dtype=torch.long, device=toks.device)
    return Selection(torch.cat([prev.to(toks.device)[parents], toks[:, None]], dim=1), top, parents)


def select_beams_stacked(tokens: Sequence, cum, logp, beam_width: int) -> list[Selection | None]:
    """`select_beams` for n requests of B beams each in one top-k (a decode step of many requests of one beam
    width: per-request calls were ~12% of the small model's engine time). `tokens`: n [B, s_i] (requests may
    be at different depths), `cum` [n, B], `logp` [n, B, vocab] (constraints already applied as -inf). A request
    whose top holds a non-finite candidate gets None: `select_beams` on its own rows then keeps only its
    finite ones."""
    import torch

    n, B, vocab = logp.shape
    top, idx = torch.topk((cum[..., None] + logp).reshape(n, B * vocab), min(beam_width, B * vocab), dim=1)
    finite = torch.isfinite(top).all(dim=1).tolist()
    parents, toks = idx // vocab, idx % vocab
    return [Selection(torch.cat([tokens[i][parents[i]], toks[i, :, None]], dim=1), top[i], parents[i])
            if finite[i] else None for i in range(n)]


def reorder_own_kv(own_kv: Sequence[tuple], r: int, parents, s_new: int) -> list:
    """Request r's generated-token KV after a step, per layer (k, v) [B', Hkv, s_new, D]: the rows of a
    forward's own KV ([R, S, Hkv, T, D] per layer) that the kept beams (`parents` [B']) extend."""
    return [(k[r, parents, :, :s_new], v[r, parents, :, :s_new]) for k, v in own_kv]


def beams_of(tokens, cum) -> list[Beam]:
    """The contract's beams from `tokens` [B, s] and `cum` [B] (already best first)."""
    return [Beam(token_ids=t, cum_logprob=float(c)) for t, c in zip(tokens.tolist(), cum.tolist())]


def row_offsets(sizes: Sequence[int]) -> list[int]:
    """[0, s0, s0 + s1, ...]: where each block of rows starts in a stacked batch, and the end."""
    return [0, *itertools.accumulate(sizes)]


def candidate_scores(log_probs: Callable, h, candidates: Sequence[Sequence[int]], i_idx, mode: str,
                     label_token_ids: Sequence[int], first_logprobs) -> list:
    """Scores of one request's candidates from their hidden rows `h` [sum(len(c)), hidden].

    `log_probs` maps hidden rows to [rows, vocab] log-probs; `i_idx` [rows] is each row's position
    in its candidate; `first_logprobs` [vocab] are the log-probs after the prompt. Mode "label": per
    candidate, the label tokens' log-probs after its last token; "sequence": the sum of its tokens'.
    """
    import torch

    lens = torch.as_tensor([len(c) for c in candidates])
    ends = torch.cumsum(lens, 0) - 1  # local row of each candidate's last token
    if mode == "label":
        lp = log_probs(h[ends.to(h.device)])  # [C, vocab]
        labels = torch.as_tensor(label_token_ids, device=lp.device)
        return lp[:, labels].tolist()
    rows = h.shape[0]
    toks = torch.as_tensor([t for c in candidates for t in c], device=h.device)
    not_last = torch.ones(rows, dtype=torch.bool, device=h.device)
    not_last[ends.to(h.device)] = False
    lp_rows = log_probs(h[not_last])  # rows predicting the next candidate token
    nxt = toks[1:][not_last[:-1]]
    per_tok = torch.zeros(rows, dtype=torch.float64, device=h.device)
    per_tok[torch.nonzero(~(i_idx == 0)).squeeze(1)] = torch.gather(lp_rows, 1, nxt[:, None]).squeeze(1)
    first = torch.as_tensor([c[0] for c in candidates], device=h.device)
    per_tok[(i_idx == 0).nonzero().squeeze(1)] = first_logprobs[first]
    cand_of_row = torch.repeat_interleave(torch.arange(len(lens), device=h.device), lens.to(h.device))
    return torch.zeros(len(lens), dtype=per_tok.dtype, device=h.device).index_add_(0, cand_of_row, per_tok).tolist()
