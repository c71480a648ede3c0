"""Full-sequence training: every train transition is a target once per epoch, in one pass per window.

A user's train sequence h_0 .. h_{n-1} is cut into consecutive chunks of targets, each at most
the method's context `c` long (`Method.context`: `methods.recent_k` for none / user_sid / soft_token, `long_m`
for none_long / text_history), tiled from the end of the sequence with a random first chunk per epoch
(so context lengths vary from epoch to epoch). A window is a chunk plus the item just before it:
items w_0 .. w_m (m <= c), targets w_1 .. w_m. Target w_j sees w_0 .. w_{j-1}: never more than the
c items the method's prompt shows at evaluation. Item 0 of each user is never a target (it has no
history), so every method trains on exactly the same item targets per epoch.

Layouts of the built-ins (S(i): the SID tokens of item i, T(i): its text; loss on every SID token of
w_1 .. w_m), each laid out by its method (`Method.window`; this module is generic):

    none, none_long   <|hist|> S(w_0) S(w_1) ... S(w_m)
    user_sid          <|usid|> U <|hist|> S(w_0) ... S(w_m)
    soft_token        <|user|> <|hist|> S(w_0) ... S(w_m)          (placeholder at position 0)
    text_history      <|text|> T(w_0) [<|next|> S(w_1)] <|sep|> T(w_1) [<|next|> S(w_2)] ...

The last target's view is exactly the method's evaluation prompt (`prompts.PromptBuilder`) followed
by its SID. In text_history each `[<|next|> S(w_j)]` block is seen only by itself (the multi-item
scoring mask, used for training) and takes the positions it would have at the end of its own prompt
(`methods/text_history.py`); a window whose longest view would not fit the model is cut shorter.

The user signal (whichever kind the method reads: user_sid's U, the soft token's vector) is computed from
the items *before* w_0 only (`user_signal.history: older`; with `all`, up to and including w_0:
`prompts.window_signal_cut`), by the source's models that never saw this user (`UserEncoder.train_vectors`:
the ALS or SASRec fold models; static features need none): no supervised target is among the interactions
that produced it. At evaluation it is computed from the items before the c context items (older) or from the
whole history (all), so training and evaluation read the same kind of signal.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from workbench.study import methods
from workbench.study.prompts import PromptBuilder, PromptError, UserEncoder, user_signals, window_signal_cut


def context_items(method: str, recent_k: int, long_m: int) -> int:
    """How many history items `method`'s prompt shows (and a window's targets see at most)."""
    return methods.get(method).context_items(recent_k, long_m)


@dataclass
class Window:
    """One training sequence: token ids, optional positions / blocks, and where the loss is read.

    The per-token fields are kept as int32 arrays: one ML-1M text_history epoch is ~18M tokens, which as
    Python int lists (ids, positions, blocks) held ~2.3 GB and as arrays ~0.3 GB."""

    user: int
    start: int  # index of w_0 in the user's train sequence (the user signal uses seq[:start])
    items: np.ndarray  # w_0 .. w_m
    ids: np.ndarray
    loss_pos: np.ndarray  # logits at these positions ...
    loss_tok: np.ndarray  # ... predict these tokens (every SID token of w_1 .. w_m)
    positions: np.ndarray | None = None  # None: 0 .. len-1
    blocks: np.ndarray | None = None  # per token: -1 shared stream, b >= 0 visible only within block b
    placeholder_pos: int | None = None
    user_vector: np.ndarray | None = None

    def __post_init__(self):
        for name in ("ids", "loss_pos", "loss_tok", "positions", "blocks"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, np.asarray(value, dtype=np.int32))

    @property
    def targets(self) -> np.ndarray:
        return self.items[1:]


@dataclass
class WindowSet:
    method: str
    windows: list[Window] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.windows)

    def lengths(self) -> np.ndarray:
        return np.array([len(w.ids) for w in self.windows], dtype=np.int64)

    def targets_per_window(self) -> np.ndarray:
        return np.array([len(w.items) - 1 for w in self.windows], dtype=np.int64)

    @property
    def n_targets(self) -> int:
        return int(sum(len(w.items) - 1 for w in self.windows))

    @property
    def n_loss_tokens(self) -> int:
        return int(sum(len(w.loss_tok) for w in self.windows))


def attended_pairs(w: Window) -> int:
    """(query, key) pairs a window's tokens attend, whatever the layout (`collate`): every stream token the stream up
    to itself, every block token the stream before it and its own block up to itself (FLOPs, `model/flops.py`)."""
    n = len(w.ids)
    if w.blocks is None:
        return n * (n + 1) // 2
    blk = w.blocks.astype(np.int64)
    stream_upto = np.cumsum(blk == -1)  # stream tokens at or before each position
    starts = np.flatnonzero(np.r_[True, blk[1:] != blk[:-1]])  # a block is one run of tokens (methods lay them so)
    run_start = starts[np.searchsorted(starts, np.arange(n), side="right") - 1]
    own = np.where(blk >= 0, np.arange(n) - run_start + 1, 0)  # its block's tokens up to itself
    return int(np.where(blk >= 0, stream_upto + own, stream_upto).sum())


def tile(n: int, ctx: int, rng: np.random.Generator, fits=None) -> list[tuple[int, int]]:
    """(start, end) windows over a sequence of n items: targets start+1 .. end, each chunk <= ctx
    targets, tiled from the end (the last chunk's length is random), covering targets 1 .. n-1 once.
    `fits(start, end)` may refuse a window (token budget): the chunk is then cut shorter."""
    out = []
    end = n - 1
    size = int(rng.integers(1, ctx + 1))
    while end >= 1:
        start = max(0, end - size)
        while fits is not None and end - start > 1 and not fits(start, end):
            start += 1
        out.append((start, end))
        end = start
        size = ctx
    return out[::-1]


class WindowBuilder:
    """Training windows of one method, built on the method's `PromptBuilder` (same tokens, same rules)."""

    def __init__(self, prompts: PromptBuilder, max_tokens: int):
        self.p = prompts
        self.method = prompts.method
        self.spec = prompts.spec
        self.ctx = prompts.context_items
        self.max_tokens = int(max_tokens)
        self.depth = prompts.item_sid_ids.shape[1]

    # ---- one window ----------------------------------------------------------------------------
    def window(self, user: int, seq: np.ndarray, start: int, end: int, signal=None) -> Window:
        """`signal`: the method's user signal as of `start` (user-SID token ids or the user vector), if any."""
        items = np.asarray(seq[start : end + 1], dtype=np.int64)
        t = self.spec.window(self.p, items, signal)
        vec = np.asarray(signal, dtype=np.float32) if self.spec.signal == methods.VECTOR else None
        return Window(user, start, items, t.ids, t.loss_pos, t.loss_tok, positions=t.positions, blocks=t.blocks,
                      placeholder_pos=t.placeholder_pos, user_vector=vec)

    def fits(self, seq: np.ndarray, start: int, end: int) -> bool:
        """Whether the window over seq[start .. end] fits `max_tokens` (always, for a method whose windows are
        bounded by its context alone)."""
        n = self.spec.longest_view(self.p, seq[start:end])
        return n is None or n <= self.max_tokens

    # ---- an epoch -----------------------------------------------------------------------------
    def epoch(self, train: Sequence[np.ndarray], encoder: UserEncoder | None, rng: np.random.Generator,
              users: Sequence[int] | None = None) -> WindowSet:
        """Every user's windows for one epoch (a fresh random tiling)."""
        out = WindowSet(self.method)
        users = range(len(train)) if users is None else users
        for u in users:
            seq = np.asarray(train[u], dtype=np.int64)
            if len(seq) < 2:
                continue
            spans = tile(len(seq), self.ctx, rng, lambda s, e, seq=seq: self.fits(seq, s, e))
            for (s, e), sig in zip(spans, self._signals(u, seq, spans, encoder)):
                out.windows.append(self.window(u, seq, s, e, sig))
        return out

    def _signals(self, user: int, seq: np.ndarray, spans, encoder: UserEncoder | None):
        if not self.spec.reads_signal:
            return [None] * len(spans)
        if encoder is None or encoder.train_vectors is None:
            raise PromptError(f"{self.method} windows need a UserEncoder with leak-free train_vectors (fold models)")
        cuts = np.array([window_signal_cut(s, encoder.history) for s, _ in spans], dtype=np.int64)
        vecs = encoder.train_vectors(user, seq, cuts)  # [n_windows, dim]
        return list(user_signals(self.p, encoder, vectors=vecs))


# ---- batches -------------------------------------------------------------------------------------
def target_batches(targets: np.ndarray, lengths: np.ndarray, batch_targets: int, rng: np.random.Generator,
                   group: int = 32) -> list[np.ndarray]:
    """Shuffled batches of windows of similar length holding ~`batch_targets` item targets each.

    Batches are sized in targets, not tokens, so every method takes the same number of optimizer
    steps over the same targets per epoch (a text window holds ~4x the tokens of a SID window for the
    same targets); windows are sorted by length within random spans to limit padding."""
    order = rng.permutation(len(lengths))
    batches: list[np.ndarray] = []
    span = group * 64  # windows sorted by length within random spans of this many
    for s in range(0, len(order), span):
        chunk = order[s : s + span]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        cur: list[int] = []
        n = 0
        for i in chunk:
            cur.append(int(i))
            n += int(targets[i])
            if n >= batch_targets:
                batches.append(np.asarray(cur))
                cur, n = [], 0
        if cur:
            batches.append(np.asarray(cur))
    rng.shuffle(batches)
    return batches


def collate(ws: WindowSet, idx: Sequence[int], pad_id: int, split_blocks: bool = True):
    """Tensors of one batch: ids [B, L], positions [B, L] or None, a bool attention mask or None (plain causal,
    right padding), loss rows (batch, position) and tokens, placeholder positions [B] (-1: none) and user vectors
    [B, dim] or None.

    Windows with blocks (text_history) come in one of two layouts (`attention.py`): `split_blocks` (the default)
    puts each window's shared stream first (padded to the batch's longest stream) and its blocks after it, with a
    [B, 1, R, L] mask for the R block rows only; otherwise the tokens stay in order under a [B, 1, L, L] mask.
    Positions are the windows' own in both: every token sees the same keys at the same positions."""
    import torch

    wins = [ws.windows[int(i)] for i in idx]
    B = len(wins)
    blocked = any(w.blocks is not None for w in wins)
    if blocked and split_blocks:
        ids, positions, mask, cols = _split_layout(wins, pad_id)
    else:
        L = max(len(w.ids) for w in wins)
        ids = torch.full((B, L), pad_id, dtype=torch.long)
        for r, w in enumerate(wins):
            ids[r, : len(w.ids)] = torch.from_numpy(w.ids)
        positions = mask = None
        if blocked:
            positions = torch.zeros((B, L), dtype=torch.long)
            mask = torch.zeros((B, 1, L, L), dtype=torch.bool)
            for r, w in enumerate(wins):
                n = len(w.ids)
                pos = torch.arange(n) if w.positions is None else torch.from_numpy(w.positions).long()
                blk = torch.full((n,), -1) if w.blocks is None else torch.from_numpy(w.blocks).long()
                positions[r, :n] = pos
                positions[r, n:] = pos[-1] + 1 + torch.arange(L - n)
                causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
                visible = (blk[None, :] == -1) | (blk[None, :] == blk[:, None])  # [q, k]
                mask[r, 0, :n, :n] = causal & visible
                mask[r, 0, n:, :] = torch.eye(L, dtype=torch.bool)[n:]  # padding rows attend to themselves
        cols = torch.from_numpy(np.concatenate([w.loss_pos for w in wins]).astype(np.int64))
    rows = torch.from_numpy(np.repeat(np.arange(B), [len(w.loss_pos) for w in wins]))
    toks = torch.from_numpy(np.concatenate([w.loss_tok for w in wins]).astype(np.int64))
    ph = torch.tensor([-1 if w.placeholder_pos is None else w.placeholder_pos for w in wins])
    vec = None
    if any(w.user_vector is not None for w in wins):
        vec = torch.from_numpy(np.stack([w.user_vector for w in wins]).astype(np.float32))
    return ids, positions, mask, (rows, cols), toks, ph, vec


def _split_layout(wins: list[Window], pad_id: int):
    """The stream-then-blocks layout of `collate`: ids, positions, the [B, 1, R, L] block mask, and where each loss
    position went (the new column of every window's loss positions, in order)."""
    import torch

    parts = []
    for w in wins:
        n = len(w.ids)
        blk = np.full(n, -1, dtype=np.int64) if w.blocks is None else w.blocks.astype(np.int64)
        parts.append((np.flatnonzero(blk == -1), np.flatnonzero(blk >= 0), blk))
    S = max(len(st) for st, _, _ in parts)
    R = max(max(len(bk) for _, bk, _ in parts), 1)
    L = S + R
    ids = np.full((len(wins), L), pad_id, dtype=np.int64)
    positions = np.zeros((len(wins), L), dtype=np.int64)
    mask = np.zeros((len(wins), 1, R, L), dtype=bool)
    cols = []
    for r, (w, (st, bk, blk)) in enumerate(zip(wins, parts)):
        pos = np.arange(len(w.ids)) if w.positions is None else w.positions.astype(np.int64)
        new_at = np.empty(len(w.ids), dtype=np.int64)  # original index -> column
        new_at[st], new_at[bk] = np.arange(len(st)), S + np.arange(len(bk))
        ids[r, new_at] = w.ids
        positions[r, new_at] = pos
        top = pos.max() + 1
        positions[r, len(st):S] = top + np.arange(S - len(st))  # stream padding: after the stream, seen by no one
        positions[r, S + len(bk):] = top + np.arange(R - len(bk))
        # block row q (original index bk[q], block blk[bk[q]]) sees the stream before it and its own block up to it
        key_orig = np.full(L, np.iinfo(np.int64).max)
        key_orig[new_at] = np.arange(len(w.ids))
        key_blk = np.full(L, -2)
        key_blk[new_at] = blk
        q_orig, q_blk = bk[:, None], blk[bk][:, None]
        mask[r, 0, : len(bk)] = (key_orig[None, :] <= q_orig) & ((key_blk[None, :] == -1) | (key_blk[None, :] == q_blk))
        mask[r, 0, len(bk):, 0] = True  # padding rows see key 0 (their outputs are never read)
        cols.append(new_at[w.loss_pos.astype(np.int64)])
    return (torch.from_numpy(ids), torch.from_numpy(positions), torch.from_numpy(mask),
            torch.from_numpy(np.concatenate(cols)))


def window_logits(model, ids, positions, mask, loss_at, placeholder_pos=None, user_vectors=None, projector=None,
                  windows_attention: bool = True):
    """Logits [n_loss, vocab] at the loss positions of a collated batch (soft token injected): `window_hidden`
    through the LM head."""
    hs = window_hidden(model, ids, positions, mask, loss_at, placeholder_pos, user_vectors, projector,
                       windows_attention)
    return model.get_output_embeddings()(hs)


def window_hidden(model, ids, positions, mask, loss_at, placeholder_pos=None, user_vectors=None, projector=None,
                  windows_attention: bool = True, backbone=None):
    """The last hidden states [n_loss, H] at the loss positions of a collated batch (soft token injected).
    `windows_attention`: through `attention.windows_attention` (the batch collated with `split_blocks`), else the
    model's own attention. `backbone`: what runs `model.base_model` (e.g. a compiled wrapper of it; default itself)."""
    import torch

    from workbench.study.attention import additive_mask, windows_attention_on

    emb = model.get_input_embeddings()(ids)  # [B, L, H]
    if projector is not None and user_vectors is not None:
        rows = torch.nonzero(placeholder_pos >= 0).squeeze(1)
        soft = projector(user_vectors[rows]).to(emb.dtype)  # [b, H]
        emb = emb.index_put((rows, placeholder_pos[rows]), soft)
    # plain windows are right-padded and causal: no real position sees a pad, so no mask is needed
    if windows_attention:
        on = torch.is_autocast_enabled(emb.device.type)
        mask = additive_mask(mask, torch.get_autocast_dtype(emb.device.type) if on else emb.dtype)
    with windows_attention_on(model) if windows_attention else contextlib.nullcontext():
        run = model.base_model if backbone is None else backbone
        h = run(inputs_embeds=emb, attention_mask=mask, position_ids=positions).last_hidden_state
    return h[loss_at[0], loss_at[1]]  # [n_loss, H]
