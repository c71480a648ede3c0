"""The trained models' evaluations, one cache entry per (checkpoint, test users, signal variant), for the two stages
that want them.

The evaluate stage ranks every (method, seed) the train stage picked on the test users (`stages/evaluate.py`).
An evaluation needs only its own model, so with `training.workers` > 1 the train stage hands each model's
evaluations to its workers as soon as that model (every learning rate of its grid) is trained (`stages/train.py`):
they fill the worker that would otherwise wait for the other one's last model, instead of running after the whole
train stage (on the quickstart: nine evaluations, 67-80 s on two threads, after a train stage whose two workers end
tens of seconds apart). Either way the entry is the same, and the evaluate stage reads it as a cache hit. A worker
ranks with its own thread count, as it trains: its rounding, not its result, may differ from the main process's
(the cache key holds neither). A stage never imports another stage, so this module is where both find it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.cache import cached, read_done
from workbench.config import section_hash, settings_from
from workbench.paths import cache_dir, data_dir
from workbench.study import methods
from workbench.study.context import say
from workbench.study.inputs import CACHE_FORMAT, StudyInputs, method_test_prompts

# Quality is measured through this engine, in this mode and dtype; the evaluation child runs carry
# them as tags so the report can join quality with load runs of the same checkpoint/engine/mode/dtype.
EVAL_ENGINE = "torch"
EVAL_MODE = "constrained"
EVAL_DTYPE = "float32"
VARIANTS = ("shuffled", "zeroed")  # the signal ablations of a method that reads one (`evaluation.signal_ablation`)
JOB = "evaluate"  # the name of an evaluation job among a train stage's jobs: (JOB, method, seed, lr, variant)


def variants(cfg, method: str) -> tuple[str, ...]:
    """The evaluations of one trained `method`: its own signal, and where it reads one and the study ablates, the
    signal shuffled across users and zeroed."""
    ablate = cfg.evaluation.signal_ablation and methods.get(method).reads_signal
    return ("own", *VARIANTS) if ablate else ("own",)


def missing(cfg, inp: StudyInputs, method: str, seed: int, lr: float, checkpoint: Path,
            users: np.ndarray) -> list[tuple]:
    """The evaluation jobs (JOB, method, seed, lr, variant) of the model at `checkpoint` whose entries are not
    complete yet."""
    return [(JOB, method, int(seed), float(lr), v) for v in variants(cfg, method)
            if read_done(cache_dir("eval", key(cfg, checkpoint, users, None, v))) is None]


def key(cfg, train_ckpt: Path, users: np.ndarray, rerank_cands, variant: str = "own") -> str:
    """Hashes everything an evaluation reads, including the re-rank candidates themselves (they come
    from SASRec, whose own cache key is not part of the checkpoint's: a retrained SASRec must not reuse
    a re-rank result computed on another SASRec's top-100)."""
    import hashlib

    cands = "none"
    if rerank_cands is not None:
        h = hashlib.sha1()
        for c in rerank_cands:
            h.update(np.asarray(c, dtype=np.int64).tobytes() + b"|")
        cands = h.hexdigest()
    # the baselines-only keys added after the key's layout are left out: a model's evaluation does not read
    # them, and a new one must not invalidate every cached evaluation
    ev = cfg.evaluation.model_dump(mode="json", exclude={"ease_lambda_grid", "sasrec_patience"})
    return section_hash("eval", CACHE_FORMAT, ev, checkpoint_ref(train_ckpt), cfg.methods.recent_k,
                        cfg.methods.long_m, users.tolist(), cands, EVAL_ENGINE, EVAL_MODE, EVAL_DTYPE, variant)


def checkpoint_ref(checkpoint: Path) -> str:
    """A checkpoint as an evaluation key names it: one of the study's own by its place in the data folder
    (`cache/train/<key>/checkpoint`, which the train key already pins), so a data folder moved to another path or
    machine keeps its evaluations with its checkpoints; any other checkpoint by its absolute path."""
    path = Path(checkpoint).resolve()
    try:
        return path.relative_to(data_dir().resolve()).as_posix()
    except ValueError:
        return str(path)


def evaluate_method(cfg, inp: StudyInputs, method: str, res, users: np.ndarray, rerank_cands, progress=True,
                    variant: str = "own") -> dict:
    """Metrics + per-user arrays of one trained checkpoint on the test users (cached); `variant`
    replaces the user signal ("shuffled" | "zeroed", `PromptSet.with_signal`) to measure what it carries."""

    def load(folder: Path, metrics: dict):
        z = np.load(folder / "per_user.npz")
        return {"metrics": metrics, "per_user": {k: z[k] for k in z.files if k.startswith("quality/")},
                "rerank_per_user": {k[7:]: z[k] for k in z.files if k.startswith("rerank:")}, "lists": z["lists"]}

    out, _, _ = cached("eval", key(cfg, res.checkpoint, users, rerank_cands, variant),
                       lambda folder: _evaluate(cfg, inp, method, res, users, rerank_cands, progress, folder, variant),
                       load, say, collective=True)  # under torchrun every rank beams its share of the users
    return out


def _evaluate(cfg, inp: StudyInputs, method: str, res, users, rerank_cands, progress: bool, folder: Path,
              variant: str = "own"):
    from workbench import dist
    from workbench.study.evaluate import EvalSettings, evaluate_checkpoint
    from workbench.study.prompts import length_stats

    ps = method_test_prompts(cfg, inp, method, res.checkpoint, users)
    if variant != "own":
        from workbench.model.checkpoint import read_meta

        lay = read_meta(res.checkpoint).layout
        zero = lay.user_codes_to_ids(np.zeros((1, len(lay.user_codebooks)), dtype=np.int64))[0].tolist() \
            if lay.user_codebooks else None
        ps = ps.with_signal(variant, cfg.seed, zero)
    ev = cfg.evaluation
    settings = settings_from(EvalSettings, ev, progress=progress)
    out = evaluate_checkpoint(res.checkpoint, ps, settings, rerank_candidates=rerank_cands, engine_name=EVAL_ENGINE,
                              dtype=EVAL_DTYPE)
    metrics = {**out["metrics"], **length_stats(ps)}
    arrays = {k: v for k, v in out["beam"].per_user.items()}
    if out["rerank"] is not None:
        arrays.update({f"rerank:{k}": v for k, v in out["rerank"].per_user.items()})
    lists = np.full((len(users), max(ev.ks)), -1, dtype=np.int64)
    for i, l in enumerate(out["beam"].lists):
        lists[i, : len(l)] = l[: max(ev.ks)]
    if dist.is_main():  # the other ranks hold the same (gathered) arrays
        np.savez(folder / "per_user.npz", lists=lists, **arrays)
    return {"metrics": metrics, "per_user": out["beam"].per_user,
            "rerank_per_user": {} if out["rerank"] is None else out["rerank"].per_user, "lists": lists}, metrics
