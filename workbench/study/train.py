"""One training loop for every personalization method: full-sequence windows (`windows.py`).

Each epoch re-tiles every user's train sequence into windows (a fresh random tiling), so every
train transition is a target once per epoch for every method. One step is a batch of windows of
similar length holding ~`batch_targets` item targets (the same steps for every method); the loss is the cross-entropy of every SID
token of every target, read only at the positions that predict them:

    h      = backbone(window tokens [+ soft token], causal or block mask)   # [B, L, H]
    logits = lm_head(h[loss positions])                                    # [n_targets x depth, V]
    loss   = CE(logits, SID tokens)

The softmax is over the full vocabulary (not only the SID block): the engines score SIDs with
full-vocabulary log-probs, so that is what the model is trained for.

For a method whose signal is the user vector (`soft_token`) the `<|user|>` row of the input embeddings is
replaced by `projector(user_vector)` and the projector trains end to end with the backbone. AdamW with
linear warm-up and cosine decay over all steps; bfloat16 autocast where the CPU has bf16 instructions
unless a measured step is clearly slower (`bf16: auto`, `BF16_SLOWER_LIMIT`). After each epoch a
validation sample is ranked by constrained beam search *through the torch engine* (the same path as the
final evaluation); the epoch with the best validation NDCG@10 is kept, training stops after `patience`
epochs without improvement. Logged per epoch: loss, validation NDCG@10 / Recall@10, training FLOPs so far
(`model/flops.py`), tokens/s.

After every epoch, and every `save_every_s` seconds of training inside one, the whole training state
(weights, optimizer, schedule, both RNGs, the best epoch so far, counters; inside an epoch also the numpy
RNG state the epoch's windows were drawn from and how many of its batches are done) is saved to
`out_dir/resume.pt`; a run stopped by a signal, a kill or the end of a session resumes from the last save
(the epoch's windows and batches drawn again from that state, its finished batches skipped) and continues
exactly as the uninterrupted run would have. An ML-1M text_history epoch is ~40 minutes on one core: a
session that ends mid-epoch loses at most `save_every_s` of it, not the whole epoch.

Under torchrun (`workbench.dist`) every rank builds the same windows and batches (one seed) and takes its
share of each batch's windows; the gradients are summed over the ranks before clip + step (`_Step.backward`),
so every rank takes the optimizer steps of one process on the whole batch and holds the same weights.
Validation is sharded like the evaluation (`beam_rank`), so every rank sees the same metrics and makes the
same best-epoch and stopping decisions; rank 0 alone writes resume.pt and the checkpoint, every rank reads
resume.pt on a resume. On GPUs each rank trains on its own (`dist.device()`); a plain run stays on the CPU.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from workbench import names
from workbench.cache import RESUME_FILE, load_state, save_state

CHECKPOINT_DIR = "checkpoint"  # the trained model inside its train cache entry (`out_dir/checkpoint/`)


@dataclass
class TrainSettings:
    epochs: int = 3
    batch_targets: int = 512
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    patience: int = 2
    bf16: bool | str = "auto"  # True | False | "auto": bf16 autocast where the CPU has it, unless clearly slower
    max_steps: int | None = None
    seed: int = 0
    trainable: str = "all"
    projector: str = "linear"
    valid_beam_width: int = 10  # beam width of the per-epoch validation (NDCG@10 needs >= 10)
    grad_clip: float = 1.0
    progress: bool = True
    save_every_s: float = 600.0  # training seconds between saves inside an epoch (0: only at epoch ends)
    attention: str = "windows"  # "windows" (study/attention.py) | "sdpa" (transformers' SDPA, windows in order)
    loss: str = "fused"  # "fused" | "chunked" (study/lm_loss.py) | "full" (the [n, vocab] logits kept, F.cross_entropy)
    compile: bool = False  # the backbone's training forward (and so backward) through torch.compile


@dataclass
class TrainResult:
    method: str
    lr: float
    checkpoint: Path
    best_epoch: int
    best_valid_ndcg10: float
    best_valid_recall10: float
    epochs_run: int
    steps: int
    train_targets: int  # item targets per epoch
    train_tokens: int  # non-pad tokens through the model, all epochs
    flops: float  # training FLOPs (forward + backward), counted by flops.train_flops
    wall_s: float
    tokens_per_s: float  # train tokens / training wall (validation excluded)
    matmul_share: float  # achieved FLOP/s over the measured matmul rate of this CPU and dtype
    bf16: bool
    history: list[dict] = field(default_factory=list)  # per epoch: loss, valid metrics, flops, time

    def to_dict(self) -> dict:
        d = self.__dict__.copy()
        # where it was written: `from_entry` no longer reads it, but a worktree at an older commit sharing the data
        # folder does (without it, that worktree would take the entry as unreadable and retrain)
        d["checkpoint"] = str(self.checkpoint)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainResult":
        d = dict(d)
        d["checkpoint"] = Path(d["checkpoint"])
        return cls(**d)

    @classmethod
    def from_entry(cls, folder: Path, info: dict) -> "TrainResult":
        """The result stored in a train cache entry. Its checkpoint is the entry's own `checkpoint/` folder, not
        the absolute path done.json was written with, so a data folder copied to another path or machine (a GPU
        host's cache brought home, a worktree's cache kept for the next session) still finds its checkpoints."""
        res = cls.from_dict(info)
        res.checkpoint = Path(folder) / CHECKPOINT_DIR
        return res


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0 at `total`."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def target_logits(model, input_ids, attention_mask, target_pos, placeholder_pos=None, user_vectors=None, projector=None):
    """Per-example layout (prompt + SID[:-1]): logits at the target positions only, [B, depth, V].
    Used to check the windowed loss against the per-example one and by checkpoint tests."""
    import torch

    emb = model.get_input_embeddings()(input_ids)  # [B, T, H]
    if projector is not None and user_vectors is not None:
        rows = torch.nonzero(placeholder_pos >= 0).squeeze(1)
        soft = projector(user_vectors[rows]).to(emb.dtype)  # [b, H]
        emb = emb.index_put((rows, placeholder_pos[rows]), soft)
    if attention_mask is not None and bool(attention_mask[:, 0].all()) and _right_padded(attention_mask):
        attention_mask = None  # right padding + causal: no real position can see a pad
    h = model.base_model(inputs_embeds=emb, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
    hs = torch.gather(h, 1, target_pos[..., None].expand(-1, -1, h.shape[-1]))  # [B, depth, H]
    return model.get_output_embeddings()(hs)


def _right_padded(mask) -> bool:
    """True when every row of a 0/1 mask is ones followed by zeros (no hole, no left padding)."""
    import torch

    m = mask.to(torch.long)
    return bool((m[:, 1:] <= m[:, :-1]).all())


def make_meta(method: str, layout, sid_version: str, backbone: str, template: str, user_dim: int | None, extra=None):
    from workbench.model.checkpoint import CheckpointMeta

    return CheckpointMeta(method=method, layout=layout, sid_version=sid_version, backbone=backbone,
                          prompt_template=template, user_vector_dim=user_dim, extra=dict(extra or {}))


def validate(loaded, valid_set, beam_width: int, progress: bool) -> dict[str, float]:
    """NDCG@10 and Recall@10 of constrained beam search through the torch engine on `valid_set`
    (`loaded`: a LoadedCheckpoint around the live model; the same code path as the final evaluation)."""
    from workbench.engines import registry
    from workbench.study.evaluate import beam_rank, device_options, per_user_metrics, ranks_of
    from workbench.sync import run_sync

    engine = registry.create_engine("torch", checkpoint=loaded, **device_options())
    try:
        br = beam_rank(engine, valid_set, loaded.catalog, max(10, beam_width), True, True, 64, "validation", progress)
    finally:
        run_sync(engine.close())
    m = per_user_metrics(ranks_of(br.lists, valid_set.targets), (10,))
    return {names.VALID_NDCG10: float(m[names.ndcg_at(10)].mean()), names.VALID_RECALL10: float(m[names.recall_at(10)].mean())}


class _Step:
    """Forward + backward of one batch; counts tokens and FLOPs."""

    def __init__(self, model, projector, pad_id: int, vocab: int, device: str = "cpu", attention: str = "windows",
                 loss: str = "fused"):
        self.model, self.projector, self.pad_id, self.vocab, self.device = model, projector, pad_id, vocab, device
        self.windows_attention = attention == "windows"
        self.chunked_loss, self.fused_loss = loss != "full", loss == "fused"
        self.backbone = None  # model.base_model itself; `compile_backbone` puts a compiled wrapper here
        head = model.get_output_embeddings()
        if self.chunked_loss and getattr(head, "bias", None) is not None:
            raise ValueError(f"training.loss: {loss} needs an LM head without bias; set training.loss: full")

    def compile_backbone(self) -> None:
        """Run the backbone through `torch.compile` (dynamic shapes: windows and batches vary in length) from the
        next step on: the model's own modules and weights stay as they are (checkpoints, resume.pt, validation)."""
        import torch

        self.backbone = torch.compile(self.model.base_model, dynamic=True)

    def collate(self, ws, idx):
        """The batch's tensors (`windows.collate`), on this step's device."""
        from workbench.study.windows import collate

        batch = collate(ws, idx, self.pad_id, split_blocks=self.windows_attention)
        if self.device != "cpu":  # a GPU rank (dist.device)
            ids, pos, mask, at, toks, ph, vec = batch
            ids, pos, mask, toks, ph, vec = (None if t is None else t.to(self.device)
                                             for t in (ids, pos, mask, toks, ph, vec))
            batch = ids, pos, mask, tuple(t.to(self.device) for t in at), toks, ph, vec
        return batch

    def forward(self, batch, ws, idx, bf16: bool):
        """Loss of the collated batch `idx` of `ws` and its counts: (loss, tokens, logit rows, attended keys)."""
        import torch
        import torch.nn.functional as F

        from workbench.study.lm_loss import chunked_lm_loss
        from workbench.study.windows import attended_pairs, window_hidden

        ids, pos, mask, at, toks, ph, vec = batch
        head = self.model.get_output_embeddings()
        with torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16, enabled=bf16):
            hs = window_hidden(self.model, ids, pos, mask, at, ph, vec, self.projector, self.windows_attention,
                               self.backbone)
            logits = None if self.chunked_loss else head(hs)
        if logits is None:  # the same function, without keeping the [n, vocab] logits (lm_loss.py)
            dtype = torch.bfloat16 if bf16 else head.weight.dtype
            loss = chunked_lm_loss(hs, head.weight, toks, dtype, self.fused_loss)
        else:
            loss = F.cross_entropy(logits.float(), toks)
        wins = [ws.windows[int(i)] for i in idx]
        return loss, sum(len(w.ids) for w in wins), len(toks), sum(attended_pairs(w) for w in wins)

    def loss(self, ws, idx, bf16: bool):
        """Loss of batch `idx` of `ws` and its counts (collate + forward)."""
        return self.forward(self.collate(ws, idx), ws, idx, bf16)

    def backward(self, ws, idx, bf16: bool, params, mark=None) -> tuple[float, int, int, int]:
        """Loss and gradients (into `.grad`) of batch `idx`: (loss, tokens, logit rows, attended keys).

        With several ranks each takes every size-th window of the batch (`dist.shard`). One process's loss
        is the mean over the batch's n SID-token targets; a rank whose windows hold n_r of them weights its
        own mean by n_r / n, so the ranks' losses, and their gradients, add up to the batch's. Gradients and
        counts are then summed over the ranks: every rank holds one process's numbers, up to rounding.
        `mark(phase)`, if given, is called as each phase ends (collate, forward, backward; one process only):
        what `workbench trainbench` times."""
        from workbench import dist

        if dist.world().size == 1:
            batch = self.collate(ws, idx)
            if mark:
                mark("collate")
            loss, n_tok, n_logit, keys = self.forward(batch, ws, idx, bf16)
            if mark:
                mark("forward")
            loss.backward()
            lv = float(loss.detach())
            if mark:
                mark("backward")
            return lv, n_tok, n_logit, keys
        import torch

        mine = dist.shard(idx)
        n_all = sum(len(ws.windows[int(i)].loss_tok) for i in idx)
        counts = [0.0, 0, 0, 0]
        if len(mine):  # a batch of fewer windows than ranks leaves some ranks none
            loss, n_tok, n_logit, keys = self.loss(ws, mine, bf16)
            loss = loss * (n_logit / n_all)
            loss.backward()
            counts = [float(loss.detach()), n_tok, n_logit, keys]
        _sum_grads(params)
        total = torch.tensor(counts, dtype=torch.float64, device=self.device)  # float64: key counts pass 2^24
        dist.all_reduce_sum(total)
        lv, n_tok, n_logit, keys = total.tolist()
        return lv, int(n_tok), int(n_logit), int(keys)


def _sum_grads(params) -> None:
    """Sum every parameter's gradient over the ranks, in one flat buffer (one collective per step). A
    parameter that no rank has a gradient for keeps none: AdamW then skips it, as it would in one process."""
    import torch

    from workbench import dist

    have = torch.tensor([p.grad is not None for p in params], dtype=params[0].dtype, device=params[0].device)
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params] + [have])
    dist.all_reduce_sum(flat)
    at = 0
    for p, h in zip(params, flat[-len(params):].tolist()):
        p.grad = flat[at : at + p.numel()].view_as(p) if h else None
        at += p.numel()


# `bf16: auto` keeps float32 only when a bfloat16 step measures this much slower. Not "whichever is faster": on an
# AVX512-BF16 CPU the two timed steps of the quickstart's small models were within a few percent, and the choice
# flipped between reruns of one code (soft_token's test N@10 0.0659 -> 0.0789 in one, none's 0.0862 -> 0.0806 in
# another), so a run was not reproducible on its own machine. With the margin the choice is the CPU's (bf16
# instructions or not) unless bfloat16 is clearly slower.
BF16_SLOWER_LIMIT = 1.2
# Steps timed per dtype, alternating; the fastest of each is compared. Two were not enough on a busy hour of a
# shared 2-core VM: a fresh clone's quickstart measured user_sid's bf16 step at 1.34x float32 (both minima of two)
# and trained it in float32, where the run before on the same code and machine had chosen bf16.
BF16_TIMED_STEPS = 4


def choose_bf16(setting, step: _Step, ws, idx) -> tuple[bool, dict]:
    """`bf16: auto`: bf16 autocast on a CUDA device (`hardware.auto_dtype`), and on the CPU where it has bf16
    instructions unless a measured training step (forward + backward, no update) is `BF16_SLOWER_LIMIT` times
    float32's or slower. Returns (choice, the timings and why)."""
    from workbench.hardware import has_bf16_instructions, is_cuda

    if setting in (True, False):
        return bool(setting), {"bf16_setting": str(setting)}
    if is_cuda(step.device):
        return True, {"bf16_setting": "auto", "bf16_reason": f"a CUDA device ({step.device})"}
    if not has_bf16_instructions():
        return False, {"bf16_setting": "auto", "bf16_reason": "no AVX512-BF16/AMX on this CPU"}
    times = {}
    for bf16 in (False, True) * BF16_TIMED_STEPS:  # (the CPU only: a CUDA device took bf16 above, untimed)
        t0 = time.perf_counter()
        loss = step.loss(ws, idx, bf16)[0]
        loss.backward()
        times.setdefault(bf16, []).append(time.perf_counter() - t0)
    step.model.zero_grad(set_to_none=True)
    if step.projector is not None:
        step.projector.zero_grad(set_to_none=True)
    f32, b16 = min(times[False]), min(times[True])
    use = bf16_from_timings(f32, b16)
    why = (f"bf16 instructions; a bfloat16 step {b16 / f32:.2f}x float32's (float32 only from "
           f"{BF16_SLOWER_LIMIT}x)")
    return use, {"bf16_setting": "auto", "step_s_float32": f32, "step_s_bfloat16": b16, "bf16_reason": why}


def bf16_from_timings(step_s_float32: float, step_s_bfloat16: float) -> bool:
    """bf16 unless its measured step is `BF16_SLOWER_LIMIT` times float32's or slower."""
    return step_s_bfloat16 < BF16_SLOWER_LIMIT * step_s_float32


def train_model(backbone, windows: Callable[[np.random.Generator], object], valid_set, item_codes: np.ndarray,
                out_dir: Path, st: TrainSettings, sid_version: str = "", user_dim: int | None = None,
                log_fn: Callable[[dict, int], None] | None = None) -> TrainResult:
    """Train `backbone` on `windows(rng)` (a fresh WindowSet per epoch), validate each epoch, save the
    best checkpoint to `out_dir/checkpoint`.

    The steps, each a method of `_Training`: set up the model, optimizer and first windows; pick the dtype
    and go on from the last save, if any (`start`); per epoch, train its batches (`train_epoch`, saving
    inside it every `save_every_s`), then validate, keep the best and decide whether to stop
    (`validate_epoch`, saving after it); finally write the best checkpoint (`finish`)."""
    run = start_training(backbone, windows, valid_set, item_codes, out_dir, st, sid_version, user_dim, log_fn)
    for epoch in range(run.first_epoch, st.epochs):
        if run.stopped:
            break
        run.train_epoch(epoch)
        run.validate_epoch(epoch)
    return run.finish()


def start_training(backbone, windows: Callable[[np.random.Generator], object], valid_set, item_codes: np.ndarray,
                   out_dir: Path, st: TrainSettings, sid_version: str = "", user_dim: int | None = None,
                   log_fn: Callable[[dict, int], None] | None = None) -> "_Training":
    """A training run set up and started (`_Training.start`: dtype picked, a save resumed): `train_model` runs its
    epochs; `workbench trainbench` drives its `optimizer_step` itself."""
    run = _Training(backbone, windows, valid_set, item_codes, Path(out_dir), st, sid_version, user_dim, log_fn)
    run.start()
    return run


class _Training:
    """One `train_model` call: its parts (model, projector, optimizer, schedule, windows and batches), the
    counters `resume.pt` keeps, and the steps that change them. A resumed run restores every counter and
    RNG state from the save and continues exactly as the uninterrupted run would have."""

    def __init__(self, backbone, windows, valid_set, item_codes: np.ndarray, out_dir: Path, st: TrainSettings,
                 sid_version: str, user_dim: int | None, log_fn):
        import torch

        from workbench import dist
        from workbench.model.backbone import apply_trainable
        from workbench.model.projector import SoftTokenProjector
        from workbench.study import methods

        self.backbone, self.windows, self.valid_set, self.item_codes = backbone, windows, valid_set, item_codes
        self.out_dir, self.st, self.sid_version, self.user_dim, self.log_fn = out_dir, st, sid_version, user_dim, log_fn
        self.main, self.device = dist.is_main(), dist.device()
        self.model, self.layout = backbone.model, backbone.layout
        torch.manual_seed(st.seed)
        self.rng = np.random.default_rng(st.seed)
        self._draw_epoch()  # the first epoch's windows and batches (numpy RNG only: the torch draws below are apart)
        self.method = self.ws.method
        self.projector = None
        if methods.get(self.method).signal == methods.VECTOR:  # the user vector is projected into the <|user|> slot
            if user_dim is None:
                raise ValueError(f"{self.method} training needs user_dim (the user vector size)")
            self.projector = SoftTokenProjector(user_dim, backbone.hidden_size, st.projector)
        if self.device != "cpu":  # a GPU rank under torchrun
            self.model.to(self.device)
            if self.projector is not None:
                self.projector.to(self.device)
        self.groups = apply_trainable(self.model, st.trainable, self.layout, self.projector)
        self.params = [p for g in self.groups for p in g["params"]]
        self.opt = torch.optim.AdamW(self.groups, lr=st.lr, weight_decay=st.weight_decay, betas=(0.9, 0.98))
        self.step_fn = _Step(self.model, self.projector, int(backbone.tokenizer.pad_token_id or 0),
                             int(self.model.config.vocab_size), self.device, st.attention, st.loss)
        n = len(self.batches) * st.epochs
        self.total = n if st.max_steps is None else min(st.max_steps, n)
        warmup = int(st.warmup_ratio * self.total)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: lr_factor(s, self.total, warmup))
        self.resume_file = out_dir / RESUME_FILE

    def _draw_epoch(self) -> None:
        """This epoch's windows and batches, drawn from the numpy RNG (whose state before is kept: a save inside
        the epoch stores it, so a resume draws the same ones again)."""
        from workbench.study.windows import target_batches

        self.epoch_rng = self.rng.bit_generator.state
        self.ws = self.windows(self.rng)
        self.batches = target_batches(self.ws.targets_per_window(), self.ws.lengths(), self.st.batch_targets,
                                      self.rng)

    # ---- start: the dtype, the counters, a resume -----------------------------------------------------
    def start(self) -> None:
        """Pick the dtype (or take the saved run's), set the counters, and go on from the last save if any."""
        from workbench import dist
        from workbench.hardware import matmul_gflops
        from workbench.sids.layout import Catalog
        from workbench.study import methods

        saved = load_state(self.resume_file)
        if saved is not None:
            self.use_bf16, self.bf16_info = saved["use_bf16"], saved["bf16_info"]
        else:  # measured on rank 0 and taken by all: the ranks must compute alike
            choice = choose_bf16(self.st.bf16, self.step_fn, self.ws, self.batches[0]) if self.main else None
            self.use_bf16, self.bf16_info = dist.broadcast(choice)
        if self.st.compile:  # after the dtype's timed steps: those time the steps, not a compilation
            self.step_fn.compile_backbone()
        self.peak = matmul_gflops("bfloat16" if self.use_bf16 else "float32", device=self.device, seconds=0.5) * 1e9
        self.meta = make_meta(self.method, self.layout, self.sid_version, self.backbone.name,
                              methods.get(self.method).layout, self.user_dim,
                              {"lr": self.st.lr, "trainable": self.st.trainable, "pretrained": self.backbone.pretrained,
                               "bf16": self.use_bf16})  # fmt: skip
        self.catalog = Catalog(self.item_codes, self.layout)
        self.best = (-1.0, -1.0, None, None, -1)  # ndcg, recall, model state, projector state, epoch
        self.history, self.step, self.tokens, self.flops, self.bad, self.train_s = [], 0, 0, 0.0, 0, 0.0
        self.first_epoch, self.stopped, self.t0 = 0, False, time.perf_counter()
        self.done_batches, self.loss_sum, self.n_batches = 0, 0.0, 0  # of the epoch run first here
        if saved is not None:
            self._resume(saved)
        if dist.world().size > 1:
            dist.check_same(_digest(self.ws, self.batches, self.params),
                            "the first epoch's windows and batches or the weights")

    def _resume(self, saved: dict) -> None:
        """Go on after the last save, as if never stopped (inside an epoch: its windows and batches drawn again
        from the saved RNG state, its done batches skipped)."""
        import torch

        self.model.load_state_dict(saved["model"])
        if self.projector is not None:
            self.projector.load_state_dict(saved["projector"])
        self.opt.load_state_dict(saved["optimizer"])
        self.sched.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["torch_rng"])
        self.rng.bit_generator.state = saved["numpy_rng"]
        self.best = tuple(saved["best"])
        self.history, self.step, self.tokens, self.flops, self.bad, self.train_s = (
            saved[k] for k in ("history", "step", "tokens", "flops", "bad", "train_s"))  # fmt: skip
        self.first_epoch, self.stopped, self.t0 = saved["epoch"], saved["stopped"], self.t0 - saved["wall_s"]
        mid = saved.get("mid")
        where = f"after epoch {self.first_epoch}"
        if mid is not None:  # inside epoch first_epoch + 1
            self.done_batches, self.loss_sum, self.n_batches = mid["batches_done"], mid["loss_sum"], mid["batches"]
            self.rng.bit_generator.state = mid["epoch_rng"]
            self._draw_epoch()
            where = f"in epoch {self.first_epoch + 1} after batch {self.done_batches} of {len(self.batches)}"
        print(f"  {self.method} lr={self.st.lr:g}: resuming {where} (step {self.step}) from {self.resume_file}",
              flush=True)

    def _state(self, epoch_done: int, mid: dict | None = None) -> dict:
        """What resume.pt holds: after `epoch_done` epochs, and (`mid`) how far the next one is."""
        import torch

        p = self.projector
        return {
            "epoch": epoch_done, "stopped": self.stopped, "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(), "projector": None if p is None else p.state_dict(),
            "scheduler": self.sched.state_dict(), "torch_rng": torch.get_rng_state(),
            "numpy_rng": self.rng.bit_generator.state, "best": list(self.best), "history": self.history,
            "step": self.step, "tokens": self.tokens, "flops": self.flops, "bad": self.bad, "train_s": self.train_s,
            "wall_s": time.perf_counter() - self.t0, "use_bf16": self.use_bf16, "bf16_info": self.bf16_info,
            "mid": mid,
        }  # fmt: skip

    # ---- one epoch ------------------------------------------------------------------------------------
    def _set_mode(self, train: bool) -> None:
        for m in (self.model, self.projector):
            if m is not None:
                m.train(train)

    def train_epoch(self, epoch: int) -> None:
        """The epoch's batches (after the ones a mid-epoch save had done), saving every `save_every_s` inside it."""
        from workbench.progress import progress

        if epoch and not (epoch == self.first_epoch and self.done_batches):  # (a mid-epoch resume drew them)
            self._draw_epoch()
        if epoch > self.first_epoch:
            self.done_batches, self.loss_sum, self.n_batches = 0, 0.0, 0
        self._set_mode(True)
        st, done = self.st, self.done_batches
        bar = progress(self.batches[done:], desc=f"{self.method} lr={st.lr:g} epoch {epoch + 1}/{st.epochs}"
                       + (f" (from batch {done + 1})" if done else ""), unit="batch", enabled=st.progress)
        te = last_save = time.perf_counter()
        for b, idx in enumerate(bar, done + 1):
            if self.step >= self.total:
                break
            bar.set_postfix(loss=f"{self.optimizer_step(idx):.3f}")
            now = time.perf_counter()
            if st.save_every_s and now - last_save >= st.save_every_s and b < len(self.batches) and self.main:
                self.train_s += now - te  # the training time up to this save counts once, whatever happens next
                save_state(self.resume_file, self._state(epoch, {"epoch_rng": self.epoch_rng, "batches_done": b,
                                                                 "loss_sum": self.loss_sum, "batches": self.n_batches}))
                te = last_save = time.perf_counter()
        bar.close()
        self.train_s += time.perf_counter() - te

    def optimizer_step(self, idx, mark=None) -> float:
        """Forward, backward, clip and one AdamW + schedule step on batch `idx`; returns its loss. `mark(phase)`:
        called as each phase ends (`_Step.backward`'s, then "optimizer")."""
        self.opt.zero_grad(set_to_none=True)
        lv, n_tok, n_logit, keys = self.step_fn.backward(self.ws, idx, self.use_bf16, self.params, mark)
        self.update()
        if mark:
            mark("optimizer")
        self.count(lv, n_tok, n_logit, keys)
        return lv

    def update(self) -> None:
        """Clip the gradients, one AdamW step, one schedule step."""
        import torch

        torch.nn.utils.clip_grad_norm_(self.params, self.st.grad_clip)
        self.opt.step()
        self.sched.step()

    def count(self, lv: float, n_tok: int, n_logit: int, keys: int) -> None:
        """One optimizer step's counters (steps, tokens, FLOPs, the epoch's loss) and its logged loss."""
        from workbench.model.flops import train_flops

        self.step += 1
        self.tokens += n_tok
        self.flops += train_flops(self.model.config, n_tok, n_logit, self.step_fn.vocab, keys)
        self.loss_sum, self.n_batches = self.loss_sum + lv, self.n_batches + 1
        if self.log_fn and self.step % 20 == 0:
            self.log_fn({names.TRAIN_LOSS: lv, "train/lr": self.sched.get_last_lr()[0]}, self.step)

    def validate_epoch(self, epoch: int) -> None:
        """Validate the epoch's weights, log them, keep them if best, decide whether to stop, save."""
        from workbench.model.checkpoint import LoadedCheckpoint

        self._set_mode(False)
        live = LoadedCheckpoint(self.out_dir, self.model, self.backbone.tokenizer, self.meta, self.catalog,
                                self.projector)
        val = validate(live, self.valid_set, self.st.valid_beam_width, self.st.progress)
        row = {"epoch": epoch + 1, "step": self.step, "train_loss": self.loss_sum / max(1, self.n_batches), **val,
               names.TRAIN_FLOPS: self.flops, "targets": self.ws.n_targets,
               "tokens_per_s": self.tokens / max(self.train_s, 1e-9), "wall_s": time.perf_counter() - self.t0}
        self.history.append(row)
        print(f"  {self.method} lr={self.st.lr:g} epoch {epoch + 1}: loss {row['train_loss']:.3f}, valid NDCG@10 "
              f"{val[names.VALID_NDCG10]:.4f} R@10 {val[names.VALID_RECALL10]:.4f}, "
              f"{row['tokens_per_s']:,.0f} tokens/s", flush=True)
        if self.log_fn:
            self.log_fn({names.TRAIN_EPOCH_LOSS: row["train_loss"], **val, names.TRAIN_FLOPS: self.flops}, self.step)
        self._keep_best(epoch, val)
        if self.main:  # the other ranks hold the same state
            save_state(self.resume_file, self._state(epoch + 1))

    def _keep_best(self, epoch: int, val: dict) -> None:
        """The best epoch's weights so far (by validation NDCG@10); stop after `patience` epochs without one."""
        if val[names.VALID_NDCG10] > self.best[0]:
            p = self.projector
            self.best = (val[names.VALID_NDCG10], val[names.VALID_RECALL10], copy.deepcopy(self.model.state_dict()),
                         None if p is None else copy.deepcopy(p.state_dict()), epoch + 1)
            self.bad = 0
        else:
            self.bad += 1
        self.stopped = self.bad >= self.st.patience or self.step >= self.total

    # ---- finish ---------------------------------------------------------------------------------------
    def finish(self) -> TrainResult:
        """The best epoch's weights into `out_dir/checkpoint` (rank 0), resume.pt removed; the run's result."""
        from workbench.model.checkpoint import save_checkpoint

        self.model.load_state_dict(self.best[2])
        if self.projector is not None:
            self.projector.load_state_dict(self.best[3])
        self.model.eval()
        final = self.out_dir / CHECKPOINT_DIR
        if self.main:
            final = save_checkpoint(final, self.model, self.backbone.tokenizer, self.meta, self.item_codes,
                                    self.projector)
            self.resume_file.unlink(missing_ok=True)  # the checkpoint holds what matters now (and is ~1/3 the size)
        self.history.append({"bf16": self.bf16_info})
        train_s = max(self.train_s, 1e-9)
        return TrainResult(
            method=self.method, lr=self.st.lr, checkpoint=final, best_epoch=self.best[4],
            best_valid_ndcg10=self.best[0], best_valid_recall10=self.best[1],
            epochs_run=sum("epoch" in h for h in self.history), steps=self.step, train_targets=self.ws.n_targets,
            train_tokens=self.tokens, flops=self.flops, wall_s=time.perf_counter() - self.t0,
            tokens_per_s=self.tokens / train_s, matmul_share=self.flops / train_s / self.peak, bf16=self.use_bf16,
            history=self.history,
        )


def _digest(ws, batches, params) -> str:
    """What the ranks must agree on before they average gradients: windows, batches, starting weights."""
    import hashlib

    h = hashlib.sha1(ws.lengths().tobytes())
    for b in batches:
        h.update(np.asarray(b, dtype=np.int64).tobytes())
    h.update(repr([float(p.detach().double().sum()) for p in params]).encode())
    return h.hexdigest()
