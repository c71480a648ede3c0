"""The method x engine matrix: each trained method's quality *through each engine*, beside its latency and cost.

Why: the study measures quality through the torch engine only (study/evaluate.py). Another engine can change a
method's answers without failing a request: a trie constraint emulated client-side, a soft token sent as
prompt embeddings, another attention kernel rounding a near-tie the other way. A load sweep with
`load.quality_users: N` (which needs `prompts_from: test_split`: the checkpoints' own test prompts) ranks a fixed
sample of N test users through the engine of each cell before its load points, the same constrained,
seen-banned beam search as evaluation, and gives the cell:

- quality: NDCG@10 and Recall@10 of the sample with a 95% users-bootstrap interval (`intervals.mean_interval`
  with one seed: one trained model per method here; the study's own table carries the seed variance);
- agreement with the reference: the cell of the sweep's first engine named `torch` on the same checkpoint
  (the engine the study's quality comes from): the share of users whose top-10 list is identical, and the
  largest per-user change of NDCG@10. A cell that runs the same computation (native or emulated) should agree
  on every list but a near-tie's; a dropped beam, a lost constraint or a mangled soft token shows here;
- whether a list that differs is a near-tie: each user's beams are compared with the reference's by the parity
  rule (`engines/parity.compare_beams`: rank by rank, a beam the other lacks must tie) within the rounding bound
  two correct evaluations of this checkpoint may show (`engines/numerics.logprob_bound`, its largest logit read
  off the sample's prompts with an in-process torch engine, in the cell's dtype). A list that differs within the
  bound is a tie broken the other way; `beyond bound` counts the users where the scores themselves disagree;
- how each feature the method needs ran on that engine (`required_features`): native / emulated /
  unsupported, with the engine's reason;
- where no offered rate held the SLO: the engine's serial capacity (1 / unloaded p50), the cost at that
  capacity and the best p99 any point saw, labelled as such, beside the infinite saturation cost.

The sample is the first N users of a permutation seeded by `load.seed`, so every engine of a checkpoint, and
every method, ranks the same users.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench import names

K = 10  # the cut the agreement and the quality columns read (NDCG@10 / Recall@10, the study's headline)
REFERENCE_ENGINE = "torch"  # the engine the study's quality is measured through


# the matrix metrics as the columns of a sweep's summary and of the report's load rows
COLUMNS = {names.MATRIX_USERS: "quality_users", names.MATRIX_NDCG: "ndcg10", names.MATRIX_NDCG_LO: "ndcg10_lo",
           names.MATRIX_NDCG_HI: "ndcg10_hi", names.MATRIX_RECALL: "recall10", names.MATRIX_AGREE: "agree_top10",
           names.MATRIX_MAX_CHANGE: "max_ndcg10_change", names.SERIAL_QPS: "serial_qps",
           names.COST_PER_1M_SERIAL: "usd_per_1m_serial", names.BEST_P99: "best_p99_ms",
           names.MATRIX_BEYOND_BOUND: "beyond_bound", names.MATRIX_MAX_LOGPROB_DIFF: "max_logprob_diff",
           names.MATRIX_BOUND: "logprob_bound"}


@dataclass
class CellQuality:
    """What one cell's ranking of the user sample gave (the lists kept for the agreement with the reference)."""

    users: np.ndarray  # [n] user index
    lists: list[list[int]]  # top-K item lists, best first
    per_user_ndcg: np.ndarray  # [n]
    metrics: dict[str, float] = field(default_factory=dict)
    beams: list[list] = field(default_factory=list)  # per user, the engine's beams (token ids, cum log-prob), best first
    prompts: list = field(default_factory=list)  # the engine prompts sent (for the rounding bound)


def sample(n_prompts: int, n: int, seed: int) -> np.ndarray:
    """Indices of the cell's user sample in a PromptSet of `n_prompts` (sorted; all when n >= n_prompts)."""
    if n >= n_prompts:
        return np.arange(n_prompts)
    return np.sort(np.random.default_rng(seed).permutation(n_prompts)[:n])


def required_features(prompts, constrained: bool) -> tuple[str, ...]:
    """The capability-matrix features a method's beam-search workload needs (engines.base.FEATURES)."""
    need = ["beam_search_all_beams"]
    if constrained:
        need.append("trie_constraint")
    if getattr(prompts, "user_vectors", None) is not None:
        need.append("soft_token_beam_search")
    return tuple(need)


def feature_marks(caps, features: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """{feature: {"status": native | emulated | unsupported | ..., "reason": ...}} for the features given."""
    return {f: {"status": caps.features[f].status.value, "reason": caps.features[f].reason} for f in features}


async def rank_sample(engine, prompts, checkpoint, load, batch: int = 8) -> CellQuality:
    """The sample's top-K lists through `engine`, as evaluation ranks them (`study.evaluate.beam_requests`:
    constrained like the sweep, seen items banned), sent in batches of `batch` on the sweep's event loop."""
    from workbench.model.checkpoint import read_catalog
    from workbench.study.outputs import Quality, beam_ranking, beam_requests, mean_interval

    sub = prompts.subset(sample(len(prompts), load.quality_users, load.seed))
    catalog = read_catalog(checkpoint)
    reqs = beam_requests(sub, range(len(sub)), catalog, load.beam_width, load.constrained, True)
    results = []
    for s in range(0, len(reqs), batch):
        results += await engine.beam_search(reqs[s : s + batch])
    br = beam_ranking(results, catalog, load.beam_width)
    if br.failures:
        raise RuntimeError(f"{br.failures} of {len(sub)} quality-sample requests failed: {br.errors[:3]}")
    lists = [lst[:K] for lst in br.lists]
    q = Quality.from_lists(prompts.method, sub.users, sub.targets, lists, (K,))
    ndcg, recall = q.per_user[names.ndcg_at(K)], q.per_user[names.recall_at(K)]
    iv = mean_interval([ndcg], seed=load.seed)
    metrics = {names.MATRIX_USERS: float(len(sub)), names.MATRIX_NDCG: float(ndcg.mean()),
               names.MATRIX_NDCG_LO: iv.lo, names.MATRIX_NDCG_HI: iv.hi, names.MATRIX_RECALL: float(recall.mean())}
    return CellQuality(sub.users, lists, ndcg, metrics, [r.beams for r in results], [r.prompt for r in reqs])


def rounding_bound(checkpoint, cell: CellQuality, steps: int, dtype: str) -> float:
    """The largest difference two correct evaluations of a `steps`-token cumulative log-prob may show on the cell's
    prompts (`numerics.logprob_bound`; the largest logit read with an in-process torch engine in float32)."""
    from workbench.engines.numerics import logprob_bound
    from workbench.engines.registry import create_engine
    from workbench.sync import run_sync

    engine = create_engine("torch", checkpoint=str(checkpoint), dtype="float32")
    try:
        z = max(float(engine.prompt_logits(p).float().abs().max()) for p in cell.prompts)
        config = engine.checkpoint.model.config
    finally:
        run_sync(engine.close())
    kv_len = max(len(p.token_ids) for p in cell.prompts) + int(steps)
    return logprob_bound(config, kv_len, steps, z, dtype)


async def run_cell(engine, caps, checkpoint, load, prompts, is_reference: bool, references: dict,
                   dtype: str = "float32") -> tuple[dict, str]:
    """One cell's quality sample, its agreement with the reference cell of the same checkpoint (measured first:
    the sweep orders the reference engine first) and its feature marks: (metrics, the marks as one tag)."""
    marks = feature_marks(caps, required_features(prompts, load.constrained))
    cell = await rank_sample(engine, prompts, checkpoint, load)
    key = str(checkpoint)
    if is_reference and key not in references:
        references[key] = cell
    metrics = dict(cell.metrics)
    if key in references:
        bkey = f"{key}#bound#{dtype}"  # once per checkpoint and dtype: every cell sends the same sample's prompts
        if bkey not in references:
            references[bkey] = rounding_bound(checkpoint, cell, load.max_new_tokens, dtype)
        bound = references[bkey]
        metrics.update(agreement(cell, references[key], bound))
    return metrics, "; ".join(f"{f}={m['status']}" for f, m in marks.items())


def agreement(cell: CellQuality, reference: CellQuality, bound: float = math.nan) -> dict[str, float]:
    """Against the reference: identical top-K lists (share of users), the largest per-user |change of NDCG@K|, the
    largest rank-by-rank |difference| of the beams' cumulative log-probs, and the users whose top-K differs and
    whose beams fail the parity rule within `bound` (the ones a broken tie does not explain)."""
    from workbench.engines.parity import compare_beams

    if not np.array_equal(cell.users, reference.users):
        raise ValueError("the agreement compares the same user sample; these cells ranked different users")
    same = np.array([a == b for a, b in zip(cell.lists, reference.lists)], dtype=bool)
    if not len(same):
        return {names.MATRIX_AGREE: math.nan, names.MATRIX_MAX_CHANGE: math.nan}
    beyond, diff = 0, 0.0
    for i in np.flatnonzero(~same):
        ok, d, _ = compare_beams(cell.beams[i], reference.beams[i], bound) if cell.beams else (False, math.inf, "")
        beyond += not ok
        diff = max(diff, d)
    for i in np.flatnonzero(same):
        if cell.beams and len(cell.beams[i]) == len(reference.beams[i]):
            diff = max(diff, compare_beams(cell.beams[i], reference.beams[i], math.inf)[1])
    return {names.MATRIX_AGREE: float(same.mean()),
            names.MATRIX_MAX_CHANGE: float(np.abs(cell.per_user_ndcg - reference.per_user_ndcg).max()),
            names.MATRIX_BEYOND_BOUND: float(beyond), names.MATRIX_MAX_LOGPROB_DIFF: diff, names.MATRIX_BOUND: bound}


def serial_capacity(unloaded_p50_ms: float, usd_per_hour: float, points) -> dict[str, float]:
    """The labelled fallback of a cell no rate held: serial capacity 1 / unloaded p50, its $ per 1M, best p99."""
    from workbench.load.cost import usd_per_million

    qps = 1e3 / unloaded_p50_ms if unloaded_p50_ms > 0 and math.isfinite(unloaded_p50_ms) else math.nan
    best = min((p.e2e_p99_ms for p in points if p.requests), default=math.nan)
    return {names.SERIAL_QPS: qps, names.COST_PER_1M_SERIAL: usd_per_million(usd_per_hour, qps if qps > 0 else None),
            names.BEST_P99: best}


def matrix_table(summary) -> Any:
    """One row per (method, engine series) of a sweep's children (`BenchResult.summary()` or the report's
    load rows): the matrix's columns, cost from the saturation QPS or, labelled, from the serial capacity."""
    import pandas as pd

    rows = []
    for _, r in summary.iterrows():
        sat = r.get("usd_per_1m", math.inf)
        serial = r.get("usd_per_1m_serial", math.nan)
        if r.get("error"):
            cost, basis = math.nan, f"failed: {str(r['error'])[:120]}"
        elif sat is not None and math.isfinite(sat):
            cost, basis = sat, "saturation within SLO"
        elif serial is not None and math.isfinite(serial):
            cost, basis = serial, "serial capacity (no rate within SLO)"
        else:
            cost, basis = math.nan, "no measurement"
        rows.append({"method": r["method"], "series": r["series"], "engine": r["engine"], "mode": r.get("mode", ""),
                     "ndcg10": r.get("ndcg10", math.nan), "ndcg10_lo": r.get("ndcg10_lo", math.nan),
                     "ndcg10_hi": r.get("ndcg10_hi", math.nan), "recall10": r.get("recall10", math.nan),
                     "agree_top10": r.get("agree_top10", math.nan), "beyond_bound": r.get("beyond_bound", math.nan),
                     "max_logprob_diff": r.get("max_logprob_diff", math.nan),
                     "logprob_bound": r.get("logprob_bound", math.nan),
                     "max_ndcg10_change": r.get("max_ndcg10_change", math.nan),
                     "unloaded_p50_ms": r.get("unloaded_p50_ms", math.nan), "best_p99_ms": r.get("best_p99_ms", math.nan),
                     "saturation_qps": r.get("saturation_qps", math.nan), "serial_qps": r.get("serial_qps", math.nan),
                     "usd_per_1m": cost, "cost_basis": basis, "features": r.get("features", "")})
    return pd.DataFrame(rows)


# the matrix's figures: title -> the artifact file the sweep's parent run keeps it in
FIGURES = {"matrix: USD per 1M requests": "matrix_cost.html", "matrix: NDCG@10 through each engine": "matrix_quality.html",
           "matrix: quality vs cost, one front per engine": "matrix_pareto.html"}


def matrix_figures(table) -> dict[str, Any]:
    """The matrix's figures by title (`FIGURES`): cost per cell, quality per cell (with the agreement), the fronts."""
    from workbench.load import plots

    cost, quality, pareto = FIGURES
    t = table.assign(agree_note=["" if a is None or not math.isfinite(a) else f"{a:.0%} identical top-10"
                                 for a in table["agree_top10"]],
                     cost_note=["" if b.startswith("saturation") else b for b in table["cost_basis"]])
    return {cost: plots.matrix_heatmap(t, "usd_per_1m", cost, "${:.3g}", "USD / 1M", notes="cost_note"),
            quality: plots.matrix_heatmap(t, "ndcg10", quality + " (quality sample)", "{:.4f}", "NDCG@10",
                                          notes="agree_note"),
            pareto: plots.matrix_pareto(t, pareto)}
