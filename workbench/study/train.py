"""One training loop for every personalization method.

Examples are (prompt, target SID) pairs from `personalization.train_examples`. The loss is the
cross-entropy of the target SID tokens only, and logits are computed only at the `item_depth`
positions that predict them (hidden states -> lm_head on those rows): with a 151k-token output
layer, full-sequence logits would dominate a small model's cost.

    input  = prompt + sid[:-1]          (right-padded; causal attention never sees the padding)
    logits = lm_head(h[len(prompt)-1 : len(prompt)-1+depth])   # [B, depth, V]
    loss   = CE(logits, sid)

For `soft_token` the `<|user|>` row of the input embeddings is replaced by `projector(user_vector)`
and the projector trains end to end with the backbone (which backbone weights train is
`model.trainable`, one global setting). AdamW with linear warm-up and cosine decay; batches are
grouped by length (less padding); optional bfloat16 autocast on CPU. After each epoch a validation
sample is ranked by constrained beam search *through the torch engine* (the same path as the final
evaluation) and the best epoch by Recall@10 is kept; training stops after `patience` epochs
without improvement. The best weights are written with `checkpoint.save_checkpoint`.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from workbench import names


@dataclass
class TrainSettings:
    epochs: int = 3
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    patience: int = 2
    bf16: bool = False
    max_steps: int | None = None
    seed: int = 0
    trainable: str = "all"
    projector: str = "linear"
    valid_beam_width: int = 10  # beam width of the per-epoch validation (Recall@10 needs >= 10)
    grad_clip: float = 1.0
    progress: bool = True


@dataclass
class TrainResult:
    method: str
    lr: float
    checkpoint: Path
    best_epoch: int
    best_valid_recall10: float
    epochs_run: int
    steps: int
    train_examples: int
    train_tokens: int
    flops: float  # ~6 x parameters x tokens (forward + backward)
    wall_s: float
    history: list[dict] = field(default_factory=list)  # per epoch: loss, valid recall@10, lr, time

    def to_dict(self) -> dict:
        d = self.__dict__.copy()
        d["checkpoint"] = str(self.checkpoint)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainResult":
        d = dict(d)
        d["checkpoint"] = Path(d["checkpoint"])
        return cls(**d)


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0 at `total`."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def length_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator, group: int = 32) -> list[np.ndarray]:
    """Shuffled batches whose members have similar lengths (sorted within groups of `group` batches)."""
    order = rng.permutation(len(lengths))
    batches = []
    span = batch_size * group
    for s in range(0, len(order), span):
        chunk = order[s : s + span]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def collate(prompts, idx, sid_ids: np.ndarray, pad_id: int):
    """Right-padded inputs plus where the target logits are read.

    Returns input_ids [B, T], attention_mask [B, T], target_pos [B, depth], targets [B, depth],
    placeholder positions [B] (-1 when none), user vectors [B, dim] or None.
    """
    import torch

    depth = sid_ids.shape[1]
    seqs, tpos, tgts, ph = [], [], [], []
    for i in idx:
        p = prompts.prompts[i]
        sid = sid_ids[prompts.targets[i]].tolist()
        seqs.append(p + sid[:-1])
        tpos.append(list(range(len(p) - 1, len(p) - 1 + depth)))
        tgts.append(sid)
        pp = prompts.placeholder_pos[i]
        ph.append(-1 if pp is None else pp)
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
    vec = None
    if prompts.user_vectors is not None:
        vec = torch.from_numpy(np.asarray(prompts.user_vectors[np.asarray(idx)], dtype=np.float32))
    return ids, mask, torch.tensor(tpos), torch.tensor(tgts), torch.tensor(ph), vec


def target_logits(model, input_ids, attention_mask, target_pos, placeholder_pos=None, user_vectors=None, projector=None):
    """Logits at the target positions only: [B, depth, V]."""
    import torch

    emb = model.get_input_embeddings()(input_ids)  # [B, T, H]
    if projector is not None and user_vectors is not None:
        rows = torch.nonzero(placeholder_pos >= 0).squeeze(1)
        soft = projector(user_vectors[rows]).to(emb.dtype)  # [b, H]
        emb = emb.index_put((rows, placeholder_pos[rows]), soft)
    # Right padding + causal attention: no real position can see a pad position, and positions are
    # 0..T-1 as at inference, so the padding mask is redundant. Passing `attention_mask=None` lets
    # SDPA take its plain causal path instead of materializing a [B, 1, T, T] mask every step.
    # `attention_mask` is still accepted (left-padded callers need it).
    if attention_mask is not None and bool(attention_mask[:, 0].all()) and _right_padded(attention_mask):
        attention_mask = None
    h = model.base_model(inputs_embeds=emb, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
    hs = torch.gather(h, 1, target_pos[..., None].expand(-1, -1, h.shape[-1]))  # [B, depth, H]
    return model.get_output_embeddings()(hs)


def _right_padded(mask) -> bool:
    """True when every row of a 0/1 mask is ones followed by zeros (no hole, no left padding)."""
    import torch

    m = mask.to(torch.long)
    return bool((m[:, 1:] <= m[:, :-1]).all())


def sid_loss(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_meta(method: str, layout, sid_version: str, backbone: str, template: str, user_dim: int | None, extra=None):
    from workbench.model.checkpoint import CheckpointMeta

    return CheckpointMeta(method=method, layout=layout, sid_version=sid_version, backbone=backbone,
                          prompt_template=template, user_vector_dim=user_dim, extra=dict(extra or {}))


def validate_recall10(loaded, valid_set, beam_width: int, progress: bool) -> float:
    """Recall@10 of constrained beam search through the torch engine on `valid_set`.

    `loaded` is a `LoadedCheckpoint` built around the live model (nothing written to disk); the
    engine runs the same code path as the final evaluation.
    """
    from workbench.engines import registry
    from workbench.study.evaluate import beam_rank, per_user_metrics, ranks_of
    from workbench.sync import run_sync

    engine = registry.create_engine("torch", checkpoint=loaded)
    try:
        br = beam_rank(engine, valid_set, loaded.catalog, max(10, beam_width), True, True, 64, "validation", progress)
    finally:
        run_sync(engine.close())
    return float(per_user_metrics(ranks_of(br.lists, valid_set.targets), (10,))[names.recall_at(10)].mean())


def train_model(
    backbone,
    train_set,
    valid_set,
    item_codes: np.ndarray,
    out_dir: Path,
    st: TrainSettings,
    sid_version: str = "",
    user_dim: int | None = None,
    log_fn: Callable[[dict, int], None] | None = None,
) -> TrainResult:
    """Train `backbone` on `train_set`, validate each epoch, save the best checkpoint to `out_dir/checkpoint`."""
    import torch

    from workbench.model.checkpoint import LoadedCheckpoint, save_checkpoint
    from workbench.sids.layout import Catalog
    from workbench.model.backbone import apply_trainable, count_parameters
    from workbench.progress import progress
    from workbench.model.projector import SoftTokenProjector

    method = train_set.method
    out_dir = Path(out_dir)
    model, layout = backbone.model, backbone.layout
    torch.manual_seed(st.seed)
    rng = np.random.default_rng(st.seed)
    projector = None
    if method == "soft_token":
        if train_set.user_vectors is None:
            raise ValueError("soft_token training needs user vectors in the PromptSet")
        user_dim = int(train_set.user_vectors.shape[1])
        projector = SoftTokenProjector(user_dim, backbone.hidden_size, st.projector)
    groups = apply_trainable(model, st.trainable, layout, projector)
    opt = torch.optim.AdamW(groups, lr=st.lr, weight_decay=st.weight_decay, betas=(0.9, 0.98))
    sid_ids = layout.item_codes_to_ids(item_codes)  # [n_items, depth]
    pad_id = int(backbone.tokenizer.pad_token_id or 0)
    lengths = train_set.lengths()
    steps_per_epoch = math.ceil(len(train_set) / st.batch_size)
    total = steps_per_epoch * st.epochs if st.max_steps is None else min(st.max_steps, steps_per_epoch * st.epochs)
    warmup = int(st.warmup_ratio * total)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, warmup))
    n_params = count_parameters(model) + (count_parameters(projector) if projector is not None else 0)
    meta = make_meta(method, layout, sid_version, backbone.name, train_set_template(backbone, method), user_dim,
                     {"lr": st.lr, "trainable": st.trainable, "pretrained": backbone.pretrained})
    catalog = Catalog(item_codes, layout)
    best = (-1.0, None, None, -1)  # recall, model state, projector state, epoch
    history, step, tokens, bad = [], 0, 0, 0
    t0 = time.perf_counter()
    for epoch in range(st.epochs):
        model.train()
        if projector is not None:
            projector.train()
        batches = length_batches(lengths, st.batch_size, rng)
        bar = progress(batches, desc=f"{method} lr={st.lr:g} epoch {epoch + 1}/{st.epochs}", unit="batch", enabled=st.progress)
        tot, nb = 0.0, 0
        for idx in bar:
            if step >= total:
                break
            ids, mask, tpos, tgts, ph, vec = collate(train_set, idx, sid_ids, pad_id)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=st.bf16):
                logits = target_logits(model, ids, mask, tpos, ph, vec, projector)
            loss = sid_loss(logits, tgts)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            params = [p for g in groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, st.grad_clip)
            opt.step()
            sched.step()
            step += 1
            tokens += int(mask.sum())
            lv = float(loss.detach())
            tot, nb = tot + lv, nb + 1
            bar.set_postfix(loss=f"{lv:.3f}")
            if log_fn and step % 10 == 0:
                log_fn({names.TRAIN_LOSS: lv, "train/lr": sched.get_last_lr()[0]}, step)
        bar.close()
        model.eval()
        if projector is not None:
            projector.eval()
        live = LoadedCheckpoint(out_dir, model, backbone.tokenizer, meta, catalog, projector)
        rec = validate_recall10(live, valid_set, st.valid_beam_width, st.progress)
        row = {"epoch": epoch + 1, "step": step, "train_loss": tot / max(1, nb), names.VALID_RECALL10: rec,
               "wall_s": time.perf_counter() - t0}
        history.append(row)
        if log_fn:
            log_fn({names.TRAIN_EPOCH_LOSS: row["train_loss"], names.VALID_RECALL10: rec}, step)
        if rec > best[0]:
            best = (rec, copy.deepcopy(model.state_dict()),
                    None if projector is None else copy.deepcopy(projector.state_dict()), epoch + 1)
            bad = 0
        else:
            bad += 1
        if bad >= st.patience or step >= total:
            break
    model.load_state_dict(best[1])
    if projector is not None:
        projector.load_state_dict(best[2])
    model.eval()
    final = save_checkpoint(out_dir / "checkpoint", model, backbone.tokenizer, meta, item_codes, projector)
    return TrainResult(
        method=method, lr=st.lr, checkpoint=final, best_epoch=best[3], best_valid_recall10=best[0],
        epochs_run=len(history), steps=step, train_examples=len(train_set), train_tokens=tokens,
        flops=6.0 * n_params * tokens, wall_s=time.perf_counter() - t0, history=history,
    )


def train_set_template(backbone, method: str) -> str:
    from workbench.study.prompts import TEMPLATES

    return TEMPLATES[method]


def with_lr(st: TrainSettings, lr: float) -> TrainSettings:
    return replace(st, lr=lr)
