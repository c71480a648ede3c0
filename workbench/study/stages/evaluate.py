"""The evaluate stage: every trained model and every baseline on the same test users, compared with
intervals that include seed variance.

What is evaluated (all on `evaluation.test_users`, all test users by default, seen items banned):

- baselines: `popularity`; `als`, a dot-product ranker on ALS vectors of its own, not the ones the
  soft token and the user SIDs are handed: an ALS fitted on train with the (regularization, alpha) that
  scores best on validation NDCG@10 among `evaluation.als_regularization_grid` x `als_alpha_grid` and the
  embeddings' own pair (the embeddings' ALS is reused only when that pair wins), and a test vector folded
  in from all of train + valid, whereas the signal methods fold in, with the embeddings' ALS, only the
  history before the items their prompt shows (`PromptBuilder.signal_history`); `ease` (`study/ease.py`),
  its lambda picked on validation NDCG@10 from `evaluation.ease_lambda_grid`, B fitted on train, test
  users scored with train + valid; `sasrec`, one per training seed, its LR picked on validation NDCG@10;
- every (method, seed) the train stage picked, context variants (`none-k5`) included, through the torch
  engine (constrained beam search);
- with `evaluation.signal_ablation`, soft_token and user_sid again with the user signal shuffled
  across users and zeroed (`PromptSet.with_signal`): what the signal carries, measured.

Every comparison (method vs none, vs als, vs ease, vs sasrec; vs none at the same context, where the study
has it: `methods.contexts`, `methods/variants.py`; a variant vs its own signal) is a seeds-then-users paired
bootstrap (`compare.comparison_table`): its interval includes seed
variance. The per-seed values are kept in the table. The same table is also computed per quartile of
the test users' history length (`slices.py`: each slice's intervals are the same bootstrap on its users).
Results go to the stage's MLflow run and to the parent (tables CSV/markdown, figures; `summary.py`).

Caching (`workbench.cache.cached`): every evaluation lives in `data/cache/eval/<key>/` (`model_evals.py`: with
training workers the train stage may have computed it already), SASRec in `data/cache/sasrec/<key>/`
(`sasrec_models.py`); under torchrun evaluation entries are computed by all ranks together, SASRec by rank 0 while
the others wait for it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from workbench import names
from workbench.study import methods, model_evals
from workbench.study.compare import Entry, comparison_table
from workbench.study.context import child_run, say
from workbench.study.inputs import StudyInputs, inputs_from_context, seen_items, test_users, use_threads

BASELINES = ("popularity", "als", "ease", "sasrec")


def evaluate_stage(ctx) -> Any:
    """Evaluate baselines and trained models; log and print the comparison table."""
    from workbench.study.slices import history_quartiles, sliced_table
    from workbench.study.summary import format_slices, format_table, log_study

    cfg = ctx.cfg
    use_threads(cfg)
    inp = inputs_from_context(ctx)
    trained = ctx.products["train"]  # the pipeline runs `train` first (DEPENDS); cache hits when unchanged
    users = test_users(cfg, inp)
    entries = _baselines(ctx, inp, users)
    for (method, seed), res in trained.items():
        for variant in model_evals.variants(cfg, method):
            name = method if variant == "own" else f"{method}/{variant}"
            tags = {**eval_tags(method, seed, res.checkpoint), names.TAG_SIGNAL: variant}
            with child_run(ctx, f"{name}/seed{seed}", tags) as run:
                t0 = time.perf_counter()
                ev = model_evals.evaluate_method(cfg, inp, method, res, users, None, variant=variant)
                e = entries.setdefault(name, Entry(name))
                e.per_seed[seed] = ev["per_user"]
                e.extra[seed] = {**ev["metrics"], names.TRAIN_FLOPS: res.flops, "train/wall_s": res.wall_s,
                                 names.BEST_VALID_NDCG10: res.best_valid_ndcg10, "lr": res.lr,
                                 names.BEST_EPOCH: float(res.best_epoch), names.EPOCHS_RUN: float(res.epochs_run),
                                 names.CONTEXT_ITEMS: float(methods.get(method).context_items(cfg.methods.recent_k,
                                                                                              cfg.methods.long_m))}
                run.log_params({"lr": res.lr, "checkpoint": str(res.checkpoint), "test_users": len(users)})
                run.log_metrics({k: v for k, v in e.extra[seed].items() if isinstance(v, (int, float))})
                m = ev["metrics"]
                say(f"  {name} seed={seed}: NDCG@10 {m[names.ndcg_at(10)]:.4f} Recall@10 {m[names.recall_at(10)]:.4f} "
                     f"({time.perf_counter() - t0:.0f}s)")
    same = methods.same_context_references(list(entries), cfg.methods.recent_k, cfg.methods.long_m)
    table = comparison_table(entries, cfg.evaluation.bootstrap, cfg.seed, same)
    table.insert(1, "test_users", len(users))
    slices = history_quartiles([len(s) for s in seen_items(inp, users)])
    by_history = sliced_table(entries, slices, cfg.evaluation.bootstrap, cfg.seed, same)
    log_study(ctx, table, trained, by_history)
    say(format_table(table, cfg))
    say(format_slices(by_history))
    ctx.products["evaluate"] = table
    ctx.products["evaluate/by_history"] = by_history
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
    with child_run(ctx, "baseline/ease", {names.TAG_METHOD: "ease"}) as run:
        lists, info = ease_test_lists(cfg, inp, users, seen, K)
        q = Quality.from_lists("ease", users, targets, lists, ks, d.n_items)
        out["ease"].per_seed[cfg.seed], out["ease"].extra[cfg.seed] = q.per_user, info
        run.log_metrics({**q.summary(), **info})
    for seed in cfg.training.seeds:
        with child_run(ctx, f"baseline/sasrec/seed{seed}", {names.TAG_METHOD: "sasrec", names.TAG_SEED: seed}) as run:
            model, st, info = sasrec(cfg, inp, seed, log_fn=run.log_metrics)
            hist = [np.r_[d.train[u], d.valid[u]] for u in users]
            q = Quality.from_lists("sasrec", users, targets, sasrec_rank(model, hist, seen, K, st.max_len), ks, d.n_items)
            out["sasrec"].per_seed[seed] = q.per_user
            out["sasrec"].extra[seed] = {names.BEST_VALID_NDCG10: info["best_valid_ndcg10"], "lr": info["lr"],
                                         **sasrec_epochs(info)}
            run.log_metrics({**q.summary(), **sasrec_epochs(info)})
    say(f"  baselines done in {time.perf_counter() - t0:.0f}s")
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
        say(f"  als regularization={reg:g} alpha={alpha:g}: valid NDCG@10 {ndcg:.4f}")
        if best is None or ndcg > best[0]:
            best = (ndcg, reg, alpha, model)
    ndcg, reg, alpha, model = best
    vecs = fold_in_users(model, [np.r_[d.train[u], d.valid[u]] for u in users])
    info = {"als/regularization": reg, "als/alpha": alpha, names.BEST_VALID_NDCG10: ndcg}
    return als_rank(vecs, model.item_factors, seen, k), info


def ease_test_lists(cfg, inp, users: np.ndarray, seen, k: int) -> tuple[list, dict]:
    """The `ease` ranker's test lists: B fitted on train with the lambda that scores best on validation
    NDCG@10 (`ease.ease_tune`), each test user scored with train + valid, as `als` and `sasrec` are."""
    from workbench.study.ease import ease_rank, ease_tune

    d = inp.interactions
    res = ease_tune(d.train, d.valid, d.n_items, cfg.evaluation.ease_lambda_grid, say)
    t0 = time.perf_counter()
    lists = ease_rank(res.weights, [np.r_[d.train[u], d.valid[u]] for u in users], seen, k)
    say(f"  ease: lambda {res.lam:g} picked (valid NDCG@10 {res.valid_ndcg10:.4f}); solve {res.fit_s:.1f}s, "
        f"tuning {res.wall_s:.0f}s, test ranking {time.perf_counter() - t0:.0f}s")
    info = {"ease/lambda": res.lam, "ease/fit_s": res.fit_s, "ease/tune_s": res.wall_s,
            names.BEST_VALID_NDCG10: res.valid_ndcg10}
    return lists, info


def sasrec(cfg, inp: StudyInputs, seed: int, log_fn=None):
    """SASRec for one training seed, its LR picked on validation NDCG@10 from `evaluation.sasrec_lr_grid`, like the
    generative models'; each (seed, lr) trained here or found in its cache entry (`sasrec_models.py`: a train-stage
    worker may have trained it already). Returns (model, settings, info)."""
    from workbench.study.sasrec_models import sasrec_model

    best = None
    for lr in cfg.evaluation.sasrec_lr_grid:
        model, st, info = sasrec_model(cfg, inp, seed, float(lr), log_fn)
        if best is None or info["best_valid_ndcg10"] > best[2]["best_valid_ndcg10"]:
            best = (model, st, info)
    return best


def sasrec_epochs(info: dict) -> dict[str, float]:
    """A SASRec's best epoch (1 = the first, as the generative models count) and epochs run, from its cache info."""
    return {names.BEST_EPOCH: float(info["best_epoch"] + 1), names.EPOCHS_RUN: float(len(info["history"]))}


def eval_tags(method: str, seed: int, checkpoint) -> dict[str, Any]:
    """Tags of one evaluation child run: what was measured, on which checkpoint, engine, mode and dtype."""
    return {names.TAG_STAGE: "evaluate", names.TAG_METHOD: method, names.TAG_SEED: seed,
            names.TAG_CHECKPOINT: str(checkpoint), names.TAG_ENGINE: model_evals.EVAL_ENGINE,
            names.TAG_MODE: model_evals.EVAL_MODE, names.TAG_DTYPE: model_evals.EVAL_DTYPE}
