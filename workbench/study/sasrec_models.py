"""The study's SASRec baselines, one cache entry per (seed, learning rate), for the two stages that want them.

The evaluate stage ranks with the SASRec of each training seed, its LR picked on validation (`stages/evaluate.py`).
Training a SASRec needs nothing the generative models produce, so with `training.workers` > 1 the train stage hands
the missing entries to its workers beside the generative models (`stages/train.py`), where they fill the worker
that finishes first instead of running alone on one core after training (on ML-1M two SASRecs of 20 epochs each
per seed; one of the two cores idles through them otherwise). Either way the entry is the same: a stage never
imports another stage, so this module is where both find it.
"""

from __future__ import annotations

from pathlib import Path

from workbench.cache import RESUME_FILE, cached, read_done
from workbench.config import section_hash
from workbench.paths import cache_dir
from workbench.study.context import say
from workbench.study.inputs import CACHE_FORMAT, StudyInputs

SASREC_FORMAT = 2  # 2: unit-scale embedding init (SASRec with N(0, 1) rows trained below popularity)
JOB = "sasrec"  # the name of a SASRec job among a train stage's (method, seed, lr) jobs


def settings(cfg, seed: int, lr: float):
    """The SasrecSettings of (seed, lr) under the study's evaluation config."""
    from workbench.study.baselines import SasrecSettings

    ev = cfg.evaluation
    return SasrecSettings(max_len=ev.sasrec_max_len or cfg.methods.long_m, epochs=ev.sasrec_epochs,
                          patience=ev.sasrec_patience, seed=seed, lr=lr)


def key(cfg, inp: StudyInputs, seed: int, lr: float) -> str:
    return section_hash("sasrec", CACHE_FORMAT, SASREC_FORMAT, settings(cfg, seed, lr).__dict__, inp.upstream_key)


def missing(cfg, inp: StudyInputs) -> list[tuple[str, int, float]]:
    """The SASRec jobs (JOB, seed, lr) whose entries are not complete yet."""
    return [(JOB, int(seed), float(lr)) for seed in cfg.training.seeds for lr in cfg.evaluation.sasrec_lr_grid
            if read_done(cache_dir("sasrec", key(cfg, inp, seed, lr))) is None]


def sasrec_model(cfg, inp: StudyInputs, seed: int, lr: float, log_fn=None):
    """SASRec of (seed, lr), trained (resumably: a stopped one goes on after its last finished epoch) or loaded.
    Returns (model, settings, info); `log_fn(metrics, epoch)` sees its curve either way (replayed from the entry
    when it was trained elsewhere: by a train-stage worker or an earlier run)."""
    import torch

    from workbench.study.baselines import build_sasrec, train_sasrec

    st = settings(cfg, seed, lr)

    def load(folder: Path, info: dict):
        model = build_sasrec(inp.interactions.n_items, st)
        model.load_state_dict(torch.load(folder / "model.pt"))
        return model.eval()

    trained_here = []

    def compute(folder: Path):
        d = inp.interactions
        res = train_sasrec(d.train, d.valid, d.n_items, st, log_fn=log_fn, resume_file=folder / RESUME_FILE)
        torch.save(res.model.state_dict(), folder / "model.pt")
        (folder / RESUME_FILE).unlink(missing_ok=True)  # model.pt holds what matters now
        trained_here.append(True)
        return res.model, {"best_epoch": res.best_epoch, "best_valid_ndcg10": res.best_valid_ndcg10,
                           "wall_s": res.wall_s, "history": res.history, "lr": lr}

    model, info, _ = cached("sasrec", key(cfg, inp, seed, lr), compute, load, say, resumable=True)
    if log_fn is not None and not trained_here:
        for row in info.get("history", []):
            log_fn({"sasrec/train_loss": row["loss"], "sasrec/valid_ndcg@10": row["valid_ndcg10"]}, row["epoch"])
    return model, st, info
