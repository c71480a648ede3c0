"""The torch engine's beam-search and scoring math, as pure functions over tensors.

Kept apart from engine.py so the search can be read (and checked) without the scheduler:
nothing here holds a thread, a queue, a future or a request; each function takes tensors (and the
catalog's prefix trie) and returns new ones. The engine's worker calls them once per forward and
keeps the per-request state. Covered: the trie mask, beam selection, the kept beams' KV, and reading beams
and candidate scores off a forward (the segments a decode or score forward takes are built in segments.py).

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


@dataclass(frozen=True)
class Selection:
    """The beams kept by one `select_beams` step."""

    tokens: Any  # [B', s + 1] LongTensor: each kept beam's generated tokens
    cum: Any  # [B'] cumulative log-probs, best first
    parents: Any  # [B'] the row of the previous beams each kept beam extends


def banned_counts_by_depth(trie, banned_items: Sequence[int], depth: int) -> list:
    """Per depth, [1, n_nodes] banned leaves under each trie node (computed once per request)."""
    return [trie.banned_counts([list(banned_items)], d) for d in range(depth)]


def constraint_mask(trie, prefixes, vocab_size: int, banned_counts=None):
    """Allowed-token mask [B, vocab_size] after `prefixes` [B, t]; `banned_counts` [B, n_nodes] at depth t.

    Built where the trie's tables are (the engine moves them to its device once): on a GPU no mask is made on the
    host and copied each step, and the prefixes (already there) never go back to the host."""
    return trie.allowed_mask(prefixes.to(trie.device), banned_counts=banned_counts, vocab_size=vocab_size)


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
    per_tok = torch.zeros(rows, dtype=torch.float64, device=h.device)  # summed in float64 whatever the log-probs' dtype
    per_tok[torch.nonzero(~(i_idx == 0)).squeeze(1)] = torch.gather(lp_rows, 1, nxt[:, None]).squeeze(1).double()
    first = torch.as_tensor([c[0] for c in candidates], device=h.device)
    per_tok[(i_idx == 0).nonzero().squeeze(1)] = first_logprobs[first].double()
    cand_of_row = torch.repeat_interleave(torch.arange(len(lens), device=h.device), lens.to(h.device))
    return torch.zeros(len(lens), dtype=per_tok.dtype, device=h.device).index_add_(0, cand_of_row, per_tok).tolist()
