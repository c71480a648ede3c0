"""Quality of a recommender: ranked item lists -> Recall/NDCG@K, MRR, bootstrap intervals, coverage.

Every method is measured the same way. A generative checkpoint is queried through an engine
(`registry.create_engine("torch", checkpoint=...)`): constrained beam search with the catalog's
prefix trie, items the user already saw (train + valid at test time) banned in the trie mask; each
beam maps back to one item; the item list is deduplicated and cut at K. Baselines (popularity,
SASRec) rank with the same seen items excluded.

Conventions (one held-out item per user):
- `rank` is the 0-based position of the target in the user's list, -1 when absent.
- Recall@K = 1[rank < K]; NDCG@K = 1/log2(rank + 2) if rank < K; MRR = 1/(rank + 1) over the
  whole returned list (at most the beam width, so it is MRR@beam_width).
- Paired bootstrap: users are resampled with replacement; the interval is the 2.5/97.5
  percentiles of the mean difference of a per-user metric between two methods on the same users.

Also here: the unconstrained SID validity share (beams that are real items without the trie),
exhaustive ranking with `score` (every catalog item scored: separates search error from model
error), re-ranking given candidates (SASRec's top-100) with `score`, and per-request latency.

Under torchrun (`workbench.dist`) `beam_rank` deals its batches of users to the ranks and gathers the
lists on every rank; a batch goes to the engine whole, as in one process, so every user's list is the one
a single process computes. The single-request latency is timed on rank 0 alone (no other rank's load).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from workbench import names
from workbench.sync import run_sync

# ---- metrics ---------------------------------------------------------------------------------


def dedup_cut(items: Sequence[int | None], k: int) -> list[int]:
    """Items in order, invalid (None) and repeated ones dropped, at most k."""
    out, seen = [], set()
    for it in items:
        if it is None or it in seen:
            continue
        seen.add(it)
        out.append(int(it))
        if len(out) == k:
            break
    return out


def ranks_of(lists: Sequence[Sequence[int]], targets: Sequence[int]) -> np.ndarray:
    """0-based rank of each target in its list, -1 when absent: [n_users]."""
    out = np.full(len(targets), -1, dtype=np.int64)
    for i, (lst, t) in enumerate(zip(lists, targets)):
        for r, it in enumerate(lst):
            if it == t:
                out[i] = r
                break
    return out


def per_user_metrics(ranks: np.ndarray, ks: Sequence[int] = names.KS) -> dict[str, np.ndarray]:
    """Per-user Recall@K, NDCG@K and reciprocal rank from 0-based ranks (-1 = miss)."""
    ranks = np.asarray(ranks)
    hit = ranks >= 0
    out: dict[str, np.ndarray] = {}
    for k in ks:
        inside = hit & (ranks < k)
        out[names.recall_at(k)] = inside.astype(np.float64)
        out[names.ndcg_at(k)] = np.where(inside, 1.0 / np.log2(np.maximum(ranks, 0) + 2.0), 0.0)
    out[names.MRR] = np.where(hit, 1.0 / (np.maximum(ranks, 0) + 1.0), 0.0)
    return out


def summarize(per_user: dict[str, np.ndarray]) -> dict[str, float]:
    return {k: float(v.mean()) if len(v) else float("nan") for k, v in per_user.items()}


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of (a - b) and its 95% percentile interval, resampling users (paired) with replacement."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired bootstrap needs the same users: {a.shape} vs {b.shape}")
    d = a - b
    if n_boot <= 0 or len(d) == 0:
        return float(d.mean()) if len(d) else float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for s in range(0, n_boot, 256):  # chunks keep memory at 256 x n_users
        m = min(256, n_boot - s)
        idx = rng.integers(0, len(d), size=(m, len(d)))
        means[s : s + m] = d[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)


def coverage(lists: Sequence[Sequence[int]], n_items: int, k: int = 10) -> float:
    """Share of the catalog that appears in at least one user's top-k list."""
    seen = {int(it) for lst in lists for it in lst[:k]}
    return len(seen) / max(1, n_items)


def top_k_excluding(scores: np.ndarray, seen: Sequence[np.ndarray], k: int) -> list[list[int]]:
    """Top-k item lists from a [n_users, n_items] score matrix with each row's seen items excluded."""
    s = np.array(scores, dtype=np.float64, copy=True)
    for i, items in enumerate(seen):
        if len(items):
            s[i, np.asarray(items, dtype=np.int64)] = -np.inf
    k = min(k, s.shape[1])
    part = np.argpartition(-s, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(part, np.argsort(-np.take_along_axis(s, part, 1), axis=1, kind="stable"), 1)
    return [[int(x) for x, v in zip(row, s[i, row]) if np.isfinite(v)] for i, row in enumerate(order)]


def top_k_rows(s: np.ndarray, seen: Sequence[np.ndarray], k: int) -> list[np.ndarray]:
    """Top-k item ids of each row of the score block `s` [m, n_items] (modified in place), `seen[i]` banned.

    Ties are broken by item id (lower first); a row with fewer than k unseen items gets them all.
    The ALS and EASE rankers share it (`baselines.als_rank`, `ease.ease_rank`).
    """
    m, n_items = s.shape
    k = min(k, n_items)
    banned = [np.asarray(seen[i], dtype=np.int64) for i in range(m)]
    rows = np.repeat(np.arange(m), [len(x) for x in banned])
    if len(rows):
        s[rows, np.concatenate(banned)] = -np.inf
    if k == 0:
        return [np.empty(0, dtype=np.int64) for _ in range(m)]
    kth = np.partition(s, n_items - k, axis=1)[:, n_items - k]  # [m] k-th largest score
    r, items = np.nonzero((s >= kth[:, None]) & np.isfinite(s))  # >= k per row when tied at kth
    order = np.lexsort((items, -s[r, items], r))  # by row, then score desc, then item id
    r, items = r[order], items[order]
    starts = np.searchsorted(r, np.arange(m + 1))
    return [items[starts[i] : min(starts[i] + k, starts[i + 1])].astype(np.int64) for i in range(m)]


@dataclass
class Quality:
    """Ranked lists of one method on a set of users, with per-user metrics."""

    name: str
    users: np.ndarray
    targets: np.ndarray
    lists: list[list[int]]
    per_user: dict[str, np.ndarray] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)  # validity, latency, prompt length, ...

    @classmethod
    def from_lists(cls, name, users, targets, lists, ks=names.KS, n_items: int | None = None) -> "Quality":
        q = cls(name, np.asarray(users), np.asarray(targets), [list(map(int, l)) for l in lists])
        q.per_user = per_user_metrics(ranks_of(q.lists, q.targets), ks)
        if n_items:
            q.extra[names.COVERAGE] = coverage(q.lists, n_items, 10)
        return q

    def summary(self) -> dict[str, float]:
        return {**summarize(self.per_user), **self.extra}


def compare(a: Quality, b: Quality, metric: str, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Paired bootstrap of a - b on `metric`, over the users both were evaluated on."""
    if not np.array_equal(a.users, b.users):
        common, ia, ib = np.intersect1d(a.users, b.users, return_indices=True)
        return paired_bootstrap(a.per_user[metric][ia], b.per_user[metric][ib], n_boot, seed)
    return paired_bootstrap(a.per_user[metric], b.per_user[metric], n_boot, seed)


# ---- engine queries ----------------------------------------------------------------------------


@dataclass
class BeamRanking:
    lists: list[list[int]]  # item lists (deduplicated, at most beam_width)
    latencies_s: np.ndarray  # per request, as timed by the engine
    valid_share: float  # share of beams that are real catalog items
    failures: int
    errors: list[str] = field(default_factory=list)


def beam_rank(
    engine,
    prompts,  # PromptSet
    catalog,
    beam_width: int,
    constrained: bool = True,
    ban_seen: bool = True,
    batch_size: int = 32,
    desc: str = "beam search",
    progress: bool = True,
) -> BeamRanking:
    """Beam search every prompt through `engine`; beams -> items (best first).

    Under torchrun a collective (every rank calls it with the same prompts): the batches of `batch_size`
    users are dealt to the ranks round-robin (`dist.shard`) and every rank returns the whole result."""
    from workbench import dist
    from workbench.progress import progress as progress_bar

    mine = dist.shard(range(0, len(prompts), batch_size))  # starts of this rank's batches (one process: all)
    bar = progress_bar(total=sum(min(batch_size, len(prompts) - s) for s in mine), desc=desc, unit="user",
                       enabled=progress)
    done: dict[int, tuple] = {}
    for s in mine:
        reqs = beam_requests(prompts, range(s, min(len(prompts), s + batch_size)), catalog, beam_width, constrained,
                             ban_seen)
        done[s] = run_sync(engine.beam_search(reqs))
        bar.update(len(reqs))
    bar.close()
    results = [r for s, rs in sorted(kv for part in dist.gather(done) for kv in part.items()) for r in rs]
    br = beam_ranking(results, catalog, beam_width)
    if br.failures and br.failures == len(prompts):
        raise RuntimeError(f"every beam-search request failed; first error: {br.errors[0]}")
    return br


def beam_requests(prompts, idx, catalog, beam_width: int, constrained: bool = True, ban_seen: bool = True) -> list:
    """The beam-search requests of prompts `idx` as evaluation sends them (seen items banned when constrained)."""
    from workbench.engines.base import BeamSearchRequest

    reqs = []
    for i in idx:
        banned = tuple(int(x) for x in prompts.seen[i]) if (ban_seen and constrained and prompts.seen) else ()
        reqs.append(BeamSearchRequest(prompts.engine_prompt(i), beam_width, catalog.depth, constrained, banned))
    return reqs


def beam_ranking(results, catalog, beam_width: int) -> BeamRanking:
    """Beam-search results -> each user's item list (beams mapped to items, deduplicated; [] for a failure)."""
    lists: list[list[int]] = []
    lat, errors = [], []
    n_beams = n_valid = 0
    for r in results:
        if not r.success:
            errors.append(r.error or "unknown error")
            lists.append([])
            continue
        items = [catalog.item_of(b.token_ids) for b in r.beams]
        n_beams += len(items)
        n_valid += sum(it is not None for it in items)
        lists.append(dedup_cut(items, beam_width))
        lat.append(r.timings.e2e_s)
    return BeamRanking(lists, np.asarray(lat), n_valid / max(1, n_beams), len(errors), errors[:5])


def score_rank(
    engine,
    prompts,
    candidates: Sequence[Sequence[int]],
    catalog,
    k: int,
    ban_seen: bool = True,
    chunk: int = 1024,
    desc: str = "score",
    progress: bool = True,
) -> list[list[int]]:
    """Rank each prompt's candidate items by `score` (sequence mode); top-k after banning seen items."""
    from workbench.engines.base import ScoreRequest
    from workbench.progress import progress as progress_bar

    out = []
    for i in progress_bar(range(len(prompts)), desc=desc, unit="user", enabled=progress):
        cands = np.asarray(candidates[i], dtype=np.int64)
        if ban_seen and prompts.seen:
            cands = cands[~np.isin(cands, prompts.seen[i])]
        if len(cands) == 0:
            out.append([])
            continue
        p = prompts.engine_prompt(i)
        reqs = [
            ScoreRequest(p, tuple(tuple(catalog.sid_tokens(int(c))) for c in cands[j : j + chunk]))
            for j in range(0, len(cands), chunk)
        ]
        results = run_sync(engine.score(reqs))
        bad = [r.error for r in results if not r.success]
        if bad:
            raise RuntimeError(f"score request failed: {bad[0]}")
        scores = np.concatenate([np.asarray(r.scores, dtype=np.float64) for r in results])
        order = np.argsort(-scores, kind="stable")[:k]
        out.append(cands[order].tolist())
    return out


def request_latency(engine, prompts, catalog, beam_width: int, n: int = 20) -> float:
    """Mean wall time (ms) of single constrained beam-search requests sent one at a time."""
    from workbench.engines.base import BeamSearchRequest

    n = min(n, len(prompts))
    if n == 0:
        return float("nan")
    first = BeamSearchRequest(prompts.engine_prompt(0), beam_width, catalog.depth, True, ())
    run_sync(engine.beam_search([first]))  # warm-up
    times = []
    for i in range(n):
        req = BeamSearchRequest(prompts.engine_prompt(i), beam_width, catalog.depth, True, tuple(map(int, prompts.seen[i])))
        t0 = time.perf_counter()
        run_sync(engine.beam_search([req]))
        times.append(time.perf_counter() - t0)
    return 1000.0 * float(np.mean(times))


def device_options() -> dict:
    """Engine options for this rank's device: none in one process (the engine's CPU default), its own GPU
    for a GPU rank under torchrun (`dist.device`)."""
    from workbench import dist

    device = dist.device()
    return {} if device == "cpu" else {"device": device}


@dataclass
class EvalSettings:
    ks: tuple[int, ...] = names.KS
    beam_width: int = 30
    batch_size: int = 32
    validity_users: int = 100  # users for the unconstrained SID-validity share
    latency_requests: int = 20  # single requests timed for the mean request latency
    exhaustive: bool = False
    rerank: bool = True
    progress: bool = True


def evaluate_checkpoint(
    checkpoint,
    prompts,
    settings: EvalSettings,
    rerank_candidates: Sequence[Sequence[int]] | None = None,
    engine_name: str = "torch",
    dtype: str = "float32",
) -> dict[str, Any]:
    """Every quality number of one checkpoint on one PromptSet, through a real engine.

    Returns {"beam": Quality, "exhaustive": Quality | None, "rerank": Quality | None, "metrics": {...}}.
    """
    from workbench import dist
    from workbench.engines import registry
    from workbench.model.checkpoint import read_catalog

    nan = float("nan")  # a value only rank 0 measures, on the others (whose results only rank 0 stores)
    catalog = read_catalog(checkpoint)
    engine = registry.create_engine(engine_name, checkpoint=str(checkpoint), dtype=dtype, **device_options())
    try:
        m = prompts.method
        br = beam_rank(engine, prompts, catalog, settings.beam_width, True, True, settings.batch_size,
                       desc=f"{m}: constrained beams", progress=settings.progress)
        beam = Quality.from_lists(m, prompts.users, prompts.targets, [l[: max(settings.ks)] for l in br.lists],
                                  settings.ks, catalog.n_items)
        metrics = dict(beam.summary())
        metrics["eval/failed_requests"] = br.failures
        metrics["latency/batch_request_mean_ms"] = 1000.0 * float(br.latencies_s.mean()) if len(br.latencies_s) else float("nan")
        nv = min(settings.validity_users, len(prompts))
        if nv:
            ur = beam_rank(engine, prompts.subset(range(nv)), catalog, min(settings.beam_width, 10), False, False,
                           settings.batch_size, desc=f"{m}: unconstrained", progress=settings.progress)
            metrics[names.SID_VALIDITY] = ur.valid_share
        metrics["latency/request_mean_ms"] = request_latency(engine, prompts, catalog, settings.beam_width,
                                                             settings.latency_requests) if dist.is_main() else nan
        out: dict[str, Any] = {"beam": beam, "exhaustive": None, "rerank": None}
        if settings.exhaustive:
            allc = [np.arange(catalog.n_items)] * len(prompts)
            lists = score_rank(engine, prompts, allc, catalog, max(settings.ks), desc=f"{m}: exhaustive",
                               progress=settings.progress)
            ex = Quality.from_lists(m, prompts.users, prompts.targets, lists, settings.ks)
            out["exhaustive"] = ex
            metrics.update({k.replace("quality/", "exhaustive/"): v for k, v in ex.summary().items()})
        if settings.rerank and rerank_candidates is not None:
            lists = score_rank(engine, prompts, rerank_candidates, catalog, 10, desc=f"{m}: rerank",
                               progress=settings.progress)
            rr = Quality.from_lists(m, prompts.users, prompts.targets, lists, (10,))
            out["rerank"] = rr
            metrics.update({k.replace("quality/", "rerank/"): v for k, v in rr.summary().items()})
        out["metrics"] = metrics
        return out
    finally:
        run_sync(engine.close())
