"""The evaluate stage: every trained model and every baseline on the same test users, compared with
intervals that include seed variance.

What is evaluated (all on `evaluation.test_users`, all test users by default, seen items banned):

- baselines: `popularity`; `als`, the dot-product ranker on the very ALS user vectors the soft
  token is handed (fold-in of train + valid, full-train item factors; regularization and alpha
  picked on validation NDCG@10 from the config grids); `sasrec`, one per training seed, its LR
  picked on validation NDCG@10;
- every (method, seed) the train stage picked, through the torch engine (constrained beam search);
- with `evaluation.signal_ablation`, soft_token and user_sid again with the user signal shuffled
  across users and zeroed (`PromptSet.with_signal`): what the signal carries, measured.

Every comparison (method vs none, vs als, vs sasrec; a variant vs its own signal) is a
seeds-then-users paired bootstrap (`intervals.seed_user_bootstrap`): its interval includes seed
variance. The per-seed values are kept in the table. Results go to the stage's MLflow run and to
the parent (table CSV/markdown, figures; `summary.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench import names
from workbench.study import methods
from workbench.study.stages import (
    child_run,
    _say,
    seen_items,
    use_threads,
    eval_tags,
    evaluate_method,
    inputs_from_context,
    sasrec,
    test_users,
)

BASELINES = ("popularity", "als", "sasrec")
VARIANTS = ("shuffled", "zeroed")
REFERENCES = ("none", "als", "sasrec")  # what every row is compared with
TABLE_METRICS = (names.recall_at(10), names.ndcg_at(10), names.MRR)


@dataclass
class Entry:
    """One row of the study: per-seed per-user metrics plus what it cost."""

    name: str
    per_seed: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # seed -> metric -> [n_users]
    extra: dict[int, dict[str, float]] = field(default_factory=dict)  # seed -> prompt tokens, FLOPs, ms, ...

    def arrays(self, metric: str) -> list[np.ndarray]:
        return [self.per_seed[s][metric] for s in sorted(self.per_seed)]


def evaluate_stage(ctx) -> Any:
    """Evaluate baselines and trained models; log and print the comparison table."""
    from workbench.study.summary import format_table, log_study

    cfg = ctx.cfg
    use_threads(cfg)
    inp = inputs_from_context(ctx)
    trained = ctx.products["train"]  # the pipeline runs `train` first (DEPENDS); cache hits when unchanged
    users = test_users(cfg, inp)
    entries = _baselines(ctx, inp, users)
    for (method, seed), res in trained.items():
        ablate = cfg.evaluation.signal_ablation and methods.get(method).reads_signal
        variants = ("own", *VARIANTS) if ablate else ("own",)
        for variant in variants:
            name = method if variant == "own" else f"{method}/{variant}"
            tags = {**eval_tags(method, seed, res.checkpoint), names.TAG_SIGNAL: variant}
            with child_run(ctx, f"{name}/seed{seed}", tags) as run:
                t0 = time.perf_counter()
                ev = evaluate_method(cfg, inp, method, res, users, None, variant=variant)
                e = entries.setdefault(name, Entry(name))
                e.per_seed[seed] = ev["per_user"]
                e.extra[seed] = {**ev["metrics"], names.TRAIN_FLOPS: res.flops, "train/wall_s": res.wall_s,
                                 names.BEST_VALID_NDCG10: res.best_valid_ndcg10, "lr": res.lr}
                run.log_params({"lr": res.lr, "checkpoint": str(res.checkpoint), "test_users": len(users)})
                run.log_metrics({k: v for k, v in e.extra[seed].items() if isinstance(v, (int, float))})
                m = ev["metrics"]
                _say(f"  {name} seed={seed}: NDCG@10 {m[names.ndcg_at(10)]:.4f} Recall@10 {m[names.recall_at(10)]:.4f} "
                     f"({time.perf_counter() - t0:.0f}s)")
    table = comparison_table(entries, cfg.evaluation.bootstrap, cfg.seed)
    table.insert(1, "test_users", len(users))
    log_study(ctx, table, trained)
    _say(format_table(table, cfg))
    ctx.products["evaluate"] = table
    return table


# ---- baselines ----------------------------------------------------------------------------------
def _baselines(ctx, inp, users: np.ndarray) -> dict[str, Entry]:
    from workbench.study.baselines import popularity_rank, sasrec_rank
    from workbench.study.evaluate import Quality

    cfg, d = ctx.cfg, inp.interactions
    seen = seen_items(inp, users)
    targets = d.test[users]
    ks, K = cfg.evaluation.ks, max(cfg.evaluation.ks)
    t0 = time.perf_counter()
    out = {n: Entry(n) for n in BASELINES}
    pop = Quality.from_lists("popularity", users, targets, popularity_rank(d.train, d.n_items, seen, K), ks, d.n_items)
    out["popularity"].per_seed[cfg.seed] = pop.per_user
    with child_run(ctx, "baseline/als", {names.TAG_METHOD: "als"}) as run:
        lists, info = als_test_lists(cfg, inp, users, seen, K)
        q = Quality.from_lists("als", users, targets, lists, ks, d.n_items)
        out["als"].per_seed[cfg.seed], out["als"].extra[cfg.seed] = q.per_user, info
        run.log_metrics({**q.summary(), **{k: v for k, v in info.items() if isinstance(v, float)}})
    for seed in cfg.training.seeds:
        with child_run(ctx, f"baseline/sasrec/seed{seed}", {names.TAG_METHOD: "sasrec", names.TAG_SEED: seed}) as run:
            model, st, info = sasrec(cfg, inp, seed, log_fn=run.log_metrics)
            hist = [np.r_[d.train[u], d.valid[u]] for u in users]
            q = Quality.from_lists("sasrec", users, targets, sasrec_rank(model, hist, seen, K, st.max_len), ks, d.n_items)
            out["sasrec"].per_seed[seed] = q.per_user
            out["sasrec"].extra[seed] = {names.BEST_VALID_NDCG10: info["best_valid_ndcg10"], "lr": info["lr"]}
            run.log_metrics(q.summary())
    _say(f"  baselines done in {time.perf_counter() - t0:.0f}s")
    return out


def als_test_lists(cfg, inp, users: np.ndarray, seen, k: int) -> tuple[list, dict]:
    """The `als` ranker's test lists: fold-in of train + valid with the ALS whose regularization and
    alpha score best on validation NDCG@10 (the embeddings' ALS is one of the candidates)."""
    from workbench.sids.embeddings import fit_als, fold_in_users
    from workbench.study.baselines import als_rank
    from workbench.study.evaluate import per_user_metrics, ranks_of

    d, emb, ev = inp.interactions, cfg.embeddings, cfg.evaluation
    grid = sorted({(float(r), float(a)) for r in ev.als_regularization_grid for a in ev.als_alpha_grid}
                  | {(float(emb.als_regularization), float(emb.als_alpha))})
    valid_users = np.arange(d.n_users)
    best = None
    for reg, alpha in grid:
        if (reg, alpha) == (float(emb.als_regularization), float(emb.als_alpha)):
            model = inp.als
        else:
            model = fit_als(d.train, d.n_items, emb.als_factors, emb.als_iterations, reg, alpha, cfg.seed,
                            show_progress=False)
        vl = als_rank(model.user_factors, model.item_factors, d.train, 10)  # valid: history = train
        ndcg = float(per_user_metrics(ranks_of(vl, d.valid[valid_users]), (10,))[names.ndcg_at(10)].mean())
        _say(f"  als regularization={reg:g} alpha={alpha:g}: valid NDCG@10 {ndcg:.4f}")
        if best is None or ndcg > best[0]:
            best = (ndcg, reg, alpha, model)
    ndcg, reg, alpha, model = best
    vecs = fold_in_users(model, [np.r_[d.train[u], d.valid[u]] for u in users])
    info = {"als/regularization": reg, "als/alpha": alpha, names.BEST_VALID_NDCG10: ndcg}
    return als_rank(vecs, model.item_factors, seen, k), info


# ---- the table ----------------------------------------------------------------------------------
def comparison_table(entries: dict[str, Entry], n_boot: int, seed: int):
    """One row per entry: mean metrics with seed-aware intervals, per-seed NDCG@10, and the paired
    differences vs none / als / sasrec (and a signal variant vs its own signal)."""
    import pandas as pd

    from workbench.study.intervals import mean_interval, seed_user_bootstrap

    n10 = names.ndcg_at(10)
    rows = []
    for name, e in entries.items():
        row: dict[str, Any] = {"method": name, "seeds": len(e.per_seed)}
        for metric in TABLE_METRICS:
            iv = mean_interval(e.arrays(metric), n_boot, seed)
            row[metric], row[f"{metric}_lo"], row[f"{metric}_hi"] = iv.mean, iv.lo, iv.hi
        row["per_seed/" + n10] = " ".join(f"{float(x.mean()):.4f}" for x in e.arrays(n10))
        refs = [r for r in REFERENCES if r != name and r in entries]
        if "/" in name:
            refs = [name.split("/")[0], *refs]
        for ref in refs:
            iv = seed_user_bootstrap(e.arrays(n10), entries[ref].arrays(n10), n_boot, seed)
            tag = "own" if "/" in name and ref == name.split("/")[0] else ref
            row[f"vs_{tag}/{n10}"], row[f"vs_{tag}/{n10}_lo"], row[f"vs_{tag}/{n10}_hi"] = iv.mean, iv.lo, iv.hi
        extras = list(e.extra.values())
        for key in (names.PROMPT_TOKENS_MEAN, names.TRAIN_FLOPS, "latency/request_mean_ms", names.SID_VALIDITY):
            vals = [x[key] for x in extras if key in x]
            row[key] = float(np.mean(vals)) if vals else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)
