"""Full-sequence training windows: coverage, context caps, the evaluation view, no leaks, one-pass loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workbench.names import METHODS
from workbench.sids.layout import SidLayout, add_dedup_digit
from workbench.study.prompts import PromptBuilder, UserEncoder
from workbench.study.windows import WindowBuilder, collate, context_items, target_batches, tile

N_ITEMS = 40


def _codes():
    rng = np.random.default_rng(0)
    return add_dedup_digit(np.stack([rng.integers(0, 4, N_ITEMS), rng.integers(0, 4, N_ITEMS)], 1))


CODES = _codes()
LAYOUT = SidLayout(base_vocab_size=100, item_codebooks=(4, 4), dedup_size=int(CODES[:, -1].max()) + 1,
                   user_codebooks=(5, 5))
SIDS = LAYOUT.item_codes_to_ids(CODES)
TEXT = [[10 + i % 80, 50 + i % 3, 60 + i % 7][: 1 + i % 3] for i in range(N_ITEMS)]  # 1-3 tokens per item


def _builder(method, k=3, m=6, max_tokens=512):
    return PromptBuilder(method, LAYOUT, SIDS, recent_k=k, long_m=m, item_text_ids=TEXT, max_prompt_tokens=max_tokens)


def _train(n_users=12):
    rng = np.random.default_rng(5)
    return [rng.permutation(N_ITEMS)[: int(rng.integers(2, 30))].astype(np.int64) for _ in range(n_users)]


class Recorder:
    """A leak-checking stand-in for the ALS fold-in: records every (user, cut) it folds in."""

    def __init__(self):
        self.cuts: list[tuple[int, int]] = []

    def train_vectors(self, user, seq, cuts):
        self.cuts += [(int(user), int(c)) for c in cuts]
        out = np.zeros((len(cuts), N_ITEMS), np.float32)
        for r, c in enumerate(cuts):
            out[r, seq[:c]] = 1.0
        return out

    def encoder(self, history="older"):
        codes = lambda v: np.stack([v.argmax(1) % 5, (v.sum(1) % 5).astype(int)], 1)  # noqa: E731
        return UserEncoder(lambda users, lists, as_of: None, N_ITEMS, codes, self.train_vectors, history)


def _tiny_model():
    """A 2-layer Qwen3 over LAYOUT's vocabulary, seeded (torch.manual_seed(0)): the windowed-loss tests' model."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=LAYOUT.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=256))


def _windows(method: str):
    """One epoch of `method`'s windows over 6 users (k=3, m=6): the windowed-loss tests' batch."""
    return WindowBuilder(_builder(method, k=3, m=6), max_tokens=256).epoch(_train(6), Recorder().encoder(),
                                                                            np.random.default_rng(4))



def test_tiling_covers_every_transition_once_within_the_context():
    rng = np.random.default_rng(0)
    for n in (2, 3, 7, 50):
        for ctx in (1, 3, 10):
            spans = tile(n, ctx, rng)
            targets = [t for s, e in spans for t in range(s + 1, e + 1)]
            assert targets == list(range(1, n))  # each transition once, in order
            assert all(1 <= e - s <= ctx for s, e in spans)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # a window starts at the previous one's end


@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_on_the_same_targets_and_each_view_is_its_eval_prompt(method):
    train = _train()
    rec = Recorder()
    b = _builder(method)
    wb = WindowBuilder(b, max_tokens=b.max_prompt_tokens)
    ws = wb.epoch(train, rec.encoder(), np.random.default_rng(1))
    got = sorted((w.user, int(t)) for w in ws.windows for t in w.targets)
    assert got == sorted((u, int(t)) for u, s in enumerate(train) for t in s[1:])  # same for every method
    ctx = context_items(method, 3, 6)
    depth = SIDS.shape[1]
    for w in ws.windows:
        seq = train[w.user]
        assert len(w.items) - 1 <= ctx and w.items.tolist() == seq[w.start : w.start + len(w.items)].tolist()
        assert len(w.loss_tok) == depth * (len(w.items) - 1)
        assert w.loss_tok.tolist() == [t for it in w.items[1:] for t in SIDS[it].tolist()]
        # the last target's view is exactly the evaluation prompt of its history (the window's items)
        hist = seq[w.start : w.start + len(w.items) - 1]
        ids = w.ids.tolist()
        signal = None
        if method == "user_sid":
            signal = ids[1:3]
        want = b.build(hist, signal)[0]
        if method == "text_history":
            blocks, positions = w.blocks.tolist(), w.positions.tolist()
            first_block = blocks.index(len(w.items) - 1)
            shared = [t for t, blk in zip(ids[:first_block], blocks[:first_block]) if blk == -1]
            view = shared + [ids[first_block]]
            pos = [p for p, blk in zip(positions[:first_block], blocks[:first_block]) if blk == -1]
            assert pos + [positions[first_block]] == list(range(len(view)))  # positions as in the prompt
        else:
            view = ids[: len(ids) - depth]
        assert view == want, (method, w.user, w.start)


@pytest.mark.parametrize("history", ["older", "all"])
@pytest.mark.parametrize("method", ["user_sid", "soft_token"])
def test_no_supervised_target_reaches_the_user_signal(method, history):
    """Over every window of a small run: the signal is computed from items strictly before the window (older) or
    up to its first item w_0 (all), never from one of its targets."""
    train = _train()
    rec = Recorder()
    b = _builder(method)
    ws = WindowBuilder(b, max_tokens=512).epoch(train, rec.encoder(history), np.random.default_rng(2))
    assert len(rec.cuts) == len(ws.windows)
    for (user, cut), w in zip(rec.cuts, ws.windows):
        assert user == w.user and cut == (w.start if history == "older" else w.start + 1)
        signal_items = set(train[user][:cut].tolist())
        assert not signal_items & set(w.targets.tolist()), "a supervised target was folded into its own signal"
        if method == "soft_token":
            assert w.user_vector[w.targets].sum() == 0 and w.placeholder_pos == 0


def test_real_fold_models_never_saw_the_windows_user():
    """With the real ALS folds: the model that folds a user's windows in was fitted without that user."""
    from workbench.sids.embeddings import fit_als, fit_als_folds, users_seen_by

    rng = np.random.default_rng(3)
    train = [rng.choice(N_ITEMS, size=int(rng.integers(5, 25)), replace=False) for _ in range(60)]
    ref = fit_als(train, N_ITEMS, factors=8, iterations=3, seed=0, show_progress=False)
    folds = fit_als_folds(train, N_ITEMS, 3, 8, 3, 0.05, 1.0, 0, reference=ref)
    enc = UserEncoder(None, 8, None, folds.vectors_as_of)
    b = _builder("soft_token")
    ws = WindowBuilder(b, max_tokens=512).epoch(train, enc, np.random.default_rng(0))
    for w in ws.windows:
        assert w.user not in set(users_seen_by(folds, folds.fold_of(w.user)).tolist())
        np.testing.assert_allclose(w.user_vector, folds.vectors_as_of(w.user, train[w.user], np.array([w.start]))[0])


def test_target_batches_hold_the_budget_and_cover_every_window():
    rng = np.random.default_rng(0)
    lengths, targets = rng.integers(5, 300, size=500), rng.integers(1, 10, size=500)
    batches = target_batches(targets, lengths, 64, np.random.default_rng(1))
    assert sorted(int(i) for b in batches for i in b) == list(range(500))
    sizes = sorted(int(targets[b].sum()) for b in batches)
    assert sum(sizes) == int(targets.sum())
    assert all(64 <= s < 64 + 10 for s in sizes[1:])  # one short batch at most (the span's remainder)


@pytest.mark.parametrize("method", ["text_history", "none", "soft_token"])
def test_windowed_loss_equals_per_example_loss(method):
    """One pass over a window (block mask, prompt positions) gives every target the loss of its own
    per-example prompt (evaluation layout + teacher-forced SID), within 1e-5."""
    import torch
    import torch.nn.functional as F

    from workbench.model.projector import SoftTokenProjector
    from workbench.study.train import target_logits
    from workbench.study.windows import window_logits

    model = _tiny_model().eval()
    proj = SoftTokenProjector(N_ITEMS, 32, "linear") if method == "soft_token" else None
    train = _train(6)
    b = _builder(method, k=3, m=6)
    ws = WindowBuilder(b, max_tokens=256).epoch(train, Recorder().encoder(), np.random.default_rng(4))
    with torch.no_grad():
        ids, pos, mask, at, toks, ph, vec = collate(ws, range(len(ws)), pad_id=0)
        win = F.cross_entropy(window_logits(model, ids, pos, mask, at, ph, vec, proj), toks, reduction="none")
        per_ex = []
        depth = SIDS.shape[1]
        for w in ws.windows:
            seq = train[w.user]
            for j, it in enumerate(w.items[1:], 1):
                prompt, p = b.build(seq[w.start : w.start + j], w.ids[1:3].tolist() if method == "user_sid" else None)
                sid = SIDS[it].tolist()
                x = torch.tensor([prompt + sid[:-1]])
                tpos = torch.tensor([list(range(len(prompt) - 1, len(prompt) - 1 + depth))])
                v = None if w.user_vector is None else torch.from_numpy(w.user_vector[None])
                lg = target_logits(model, x, torch.ones_like(x), tpos, torch.tensor([p if p is not None else -1]), v, proj)
                per_ex.append(F.cross_entropy(lg[0], torch.tensor(sid), reduction="none"))
    per_ex = torch.cat(per_ex)
    assert len(per_ex) == len(win) and (win - per_ex).abs().max().item() < 1e-5


def test_training_threads_bound_numpys_blas_too():
    """`training.num_threads` limits numpy's BLAS as well as torch: the user signal of every training window is
    folded in with numpy each epoch, and a BLAS thread per core spinning beside another study process made one
    epoch's fold-ins ~30x slower."""
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    from workbench.config import load_study
    from workbench.study.inputs import use_threads

    cfg = load_study(Path(__file__).parents[1] / "experiments/quickstart.yaml", {"training": {"num_threads": 1}})
    before = torch.get_num_threads()
    try:
        with threadpool_limits(2, "blas"):  # restored on exit, whatever use_threads set inside
            use_threads(cfg)
            blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
            assert blas and all(n == 1 for n in blas), blas
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("method", ["text_history", "none"])
def test_both_layouts_give_the_same_losses_and_attended_pairs(method):
    """The stream-then-blocks layout with `attention.windows_attention` (the default) and the in-order layout under a
    full mask with transformers' SDPA (`training.attention: sdpa`) give every target the same loss: within 1e-5 in
    float32 (the per-example test's bound) and, in bfloat16 autocast, within 0.05 nats, ~8 bf16 roundings (2^-8
    each) of a loss of ~ln(vocab) ~ 4.6 nats. The attended (query, key) pairs counted for FLOPs equal the in-order
    mask's visible pairs of real tokens."""
    import torch
    import torch.nn.functional as F

    from workbench.study.windows import attended_pairs, window_logits

    model = _tiny_model().eval()
    ws = _windows(method)
    idx = range(len(ws))
    for bf16, bound in ((False, 1e-5), (True, 0.05)):
        losses = []
        for split in (True, False):
            ids, pos, mask, at, toks, ph, vec = collate(ws, idx, pad_id=0, split_blocks=split)
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = window_logits(model, ids, pos, mask, at, ph, vec, None, windows_attention=split)
            losses.append(F.cross_entropy(logits.float(), toks, reduction="none"))
        assert (losses[0] - losses[1]).abs().max().item() < bound
    _, _, full, *_ = collate(ws, idx, pad_id=0, split_blocks=False)
    for r, w in enumerate(ws.windows):
        n = len(w.ids)
        visible = int(full[r, 0, :n, :n].sum()) if full is not None else n * (n + 1) // 2
        assert attended_pairs(w) == visible


@pytest.mark.timeout(300)
def test_a_compiled_backbone_gives_the_same_loss_and_gradients():
    """`training.compile`: the study's step with the backbone through torch.compile (dynamic shapes) gives the loss and
    the gradients of the eager step on the same text_history batch, within 1e-4 relative in float32: the compiled
    kernels fuse and reorder float32 sums (~2^-24 each) over at most a few thousand terms per output. A second batch of
    another shape runs on the same compiled function (dynamic shapes, no error)."""
    import torch

    from workbench.study.train import _Step

    model = _tiny_model()
    ws = _windows("text_history")
    step = _Step(model, None, 0, model.config.vocab_size)
    results = []
    for compiled in (False, True):
        if compiled:
            step.compile_backbone()
        model.zero_grad(set_to_none=True)
        loss = step.loss(ws, range(len(ws)), False)[0]
        loss.backward()
        results.append((float(loss.detach()), [p.grad.clone() for p in model.parameters()]))
    (l0, g0), (l1, g1) = results
    assert abs(l0 - l1) <= 1e-4 * abs(l0)
    for a, b in zip(g0, g1):
        assert float((a - b).abs().max()) <= 1e-4 * float(a.abs().max()) + 1e-12
    assert torch.isfinite(step.loss(ws, range(len(ws) // 2), False)[0])
