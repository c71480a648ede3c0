"""Parity of any engine against the torch engine (the oracle) on the same checkpoint and prompts.

One function, `compare_engines`, runs a small fixed suite - beam search (plain, constrained,
soft token), sequence scoring and label scoring (plain and soft token) - on both engines and
returns a JSON-able report with one case per feature: passed / failed / skipped (with the reason,
e.g. the engine declares the feature unsupported). The tests, notebook 03, `workbench engines
validate NAME` and `scripts/validate_gpu_engines.sh` all use it, so "parity" means the same thing
everywhere.

Beam comparison rule: cumulative log-probs of the beams agree within `tol` rank by rank, every
beam the engine returns that the oracle also returns has the same score within `tol`, and a beam
only the engine returns must tie (within `tol`) with the oracle's beam at that rank: top beams may
differ only where log-probs are within `tol` of each other.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest


@dataclass
class ParityCase:
    name: str
    status: str  # passed | failed | skipped
    max_abs_diff: float | None = None
    detail: str = ""
    engine_s: float = 0.0
    oracle_s: float = 0.0


@dataclass
class ParityReport:
    engine: str
    checkpoint: str
    tol: float
    cases: list[ParityCase] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != "failed" for c in self.cases)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "checkpoint": self.checkpoint, "tol": self.tol, "ok": self.ok,
                "cases": [asdict(c) for c in self.cases]}


def compare_beams(got, want, tol: float = 1e-3) -> tuple[bool, float, str]:
    """(ok, max |diff|, why) for two beam lists (best first), by the module docstring's rule."""
    if len(got) != len(want):
        return False, float("inf"), f"{len(got)} beams vs {len(want)}"
    g = np.array([b.cum_logprob for b in got])
    w = np.array([b.cum_logprob for b in want])
    diff = float(np.max(np.abs(g - w))) if len(g) else 0.0
    if diff > tol:
        return False, diff, f"rank-by-rank cumulative log-probs differ by {diff:.2e}"
    want_by_tokens = {tuple(b.token_ids): b.cum_logprob for b in want}
    for i, b in enumerate(got):
        key = tuple(b.token_ids)
        if key in want_by_tokens:
            if abs(b.cum_logprob - want_by_tokens[key]) > tol:
                return False, diff, f"beam {key} scored {b.cum_logprob:.5f} vs {want_by_tokens[key]:.5f}"
        elif abs(b.cum_logprob - want[i].cum_logprob) > tol:
            return False, diff, f"beam {key} at rank {i} is not in the oracle's beams and does not tie"
    return True, diff, ""


def _max_diff(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def make_prompts(checkpoint, n_prompts: int = 2, prompt_len: int = 24, seed: int = 0) -> dict[str, list[Prompt]]:
    """Synthetic prompts (`engines/workloads.py`, the one builder): plain ones, and for a soft-token
    checkpoint the same prompts with the `<|user|>` placeholder and a user vector."""
    from workbench.engines.workloads import SyntheticWorkload, WorkloadShape
    from workbench.model.checkpoint import read_meta

    shape = WorkloadShape("beam_search", prompt_tokens=prompt_len, seed=seed)
    plain = SyntheticWorkload.from_checkpoint(shape, checkpoint, soft_token=False)
    out = {"plain": [plain.prompt(i) for i in range(n_prompts)], "soft": []}
    if read_meta(checkpoint).user_vector_dim is not None:
        soft = SyntheticWorkload.from_checkpoint(shape, checkpoint, soft_token=True)
        out["soft"] = [soft.prompt(i) for i in range(n_prompts)]
    return out


async def _timed(coro):
    t0 = time.perf_counter()
    out = await coro
    return out, time.perf_counter() - t0


async def compare_engines(engine, oracle, checkpoint, *, n_prompts: int = 2, prompt_len: int = 24, beam_width: int = 4,
                          n_candidates: int = 6, tol: float | None = None, dtype: str = "float32",
                          seed: int = 0) -> ParityReport:
    """Run the suite on `engine` and `oracle` (both already built on `checkpoint`).

    `tol` None: the rounding bound of `dtype` (the lower precision of the two engines) derived in
    `engines/numerics.py` for this checkpoint, these prompts and a SID's length of tokens, Z read off
    the oracle's logits: ~1e-3 in float32 on small checkpoints, some 2^16 times looser in bfloat16
    (its unit roundoff is 2^-8): bf16 parity can only catch errors far larger than bf16 rounding."""
    from workbench.model.checkpoint import read_catalog, read_meta

    meta = read_meta(checkpoint)
    catalog = read_catalog(checkpoint)
    depth = catalog.depth
    prompts = make_prompts(checkpoint, n_prompts, prompt_len, seed)
    if tol is None:
        from workbench.engines.numerics import engine_bound

        tol = engine_bound(oracle, prompts["plain"] + prompts["soft"], depth, dtype)
    caps = engine.capabilities()
    report = ParityReport(getattr(engine, "name", "?"), str(checkpoint), tol)
    rng = np.random.default_rng(seed + 1)
    cands = tuple(tuple(catalog.sid_tokens(int(i))) for i in rng.choice(catalog.n_items, n_candidates, replace=False))
    labels = tuple(int(x) for x in rng.choice(meta.layout.base_vocab_size - 2, 2, replace=False) + 2)

    def skipped(name, feature, plist) -> bool:
        """Record a skipped case (feature not offered by the engine, or no soft-token prompts)."""
        if feature and not caps.supports(feature):
            fs = caps.features[feature]
            report.cases.append(ParityCase(name, "skipped", detail=f"{fs.status.value}: {fs.reason}"))
            return True
        if not plist:
            report.cases.append(ParityCase(name, "skipped", detail="checkpoint has no soft-token projector"))
            return True
        return False

    async def beam_case(name, feature, plist, constrained):
        if skipped(name, feature, plist):
            return
        reqs = [BeamSearchRequest(p, beam_width, depth, constrained=constrained) for p in plist]
        (got, te), (want, to) = await _timed(engine.beam_search(reqs)), await _timed(oracle.beam_search(reqs))
        worst, why, status = 0.0, "", "passed"
        for g, w in zip(got, want):
            if not (g.success and w.success):
                status, why = "failed", f"engine error: {g.error}; oracle error: {w.error}"
                break
            ok, d, reason = compare_beams(g.beams, w.beams, tol)
            worst = max(worst, d)
            if not ok:
                status, why = "failed", reason
                break
        report.cases.append(ParityCase(name, status, worst, why, te, to))

    async def score_case(name, feature, plist, mode):
        if skipped(name, feature, plist):
            return
        reqs = [ScoreRequest(p, cands, mode=mode, label_token_ids=labels if mode == "label" else ()) for p in plist]
        # an engine whose label scores also condition on tokens before each item (SGLang's MIS delimiter)
        # is compared with the oracle scoring those tokens + the item: the same conditioning on both sides
        prefix = tuple(getattr(engine, "label_candidate_prefix", ())) if mode == "label" else ()
        oracle_reqs = reqs if not prefix else [
            ScoreRequest(p, tuple(prefix + tuple(c) for c in cands), mode=mode, label_token_ids=labels) for p in plist]
        (got, te), (want, to) = await _timed(engine.score(reqs)), await _timed(oracle.score(oracle_reqs))
        if not all(g.success for g in got):
            err = next(g.error for g in got if not g.success)
            status = "skipped" if "unsupported" in (err or "") else "failed"
            report.cases.append(ParityCase(name, status, detail=err or "", engine_s=te, oracle_s=to))
            return
        if not all(w.success for w in want):
            report.cases.append(ParityCase(name, "failed", detail=f"oracle error: {want[0].error}"))
            return
        d = max(_max_diff(g.scores, w.scores) for g, w in zip(got, want))
        note = f"oracle items prefixed with {list(prefix)} (the engine's own conditioning)" if prefix else ""
        report.cases.append(ParityCase(name, "passed" if d <= tol else "failed", d,
                                       "; ".join(x for x in (note, "" if d <= tol else f"scores differ by {d:.2e}")
                                                 if x), te, to))

    await beam_case("beam_search", "beam_search_all_beams", prompts["plain"], False)
    await beam_case("beam_search_constrained", "trie_constraint", prompts["plain"], True)
    await beam_case("beam_search_soft_token", "soft_token_beam_search", prompts["soft"], False)
    await score_case("score_sequence", "fanout_scoring", prompts["plain"], "sequence")
    await score_case("score_label", "fanout_scoring", prompts["plain"], "label")
    await score_case("score_sequence_soft_token", "soft_token", prompts["soft"], "sequence")
    await score_case("score_label_soft_token", "soft_token", prompts["soft"], "label")
    return report


async def run_parity(name: str, checkpoint, dtype: str = "float32", url: str | None = None, **kw) -> dict:
    """Build engine `name` (launching its server unless `url`) and the torch oracle, both in `dtype`
    ("auto" resolved per engine: a GPU engine in bf16 may meet a float32 oracle on an AVX2 CPU); return the
    report dict (its `tol` derived for the lower precision of the two unless given)."""
    from workbench.engines.numerics import HALF
    from workbench.engines.registry import create_engine, engine_class
    from workbench.hardware import resolve_dtype

    edt, odt = resolve_dtype(dtype, name), resolve_dtype(dtype, "torch")
    oracle = create_engine("torch", checkpoint=checkpoint, dtype=odt)
    if url is not None:
        engine = engine_class(name)(checkpoint=checkpoint, dtype=edt, url=url)
    else:
        engine = create_engine(name, checkpoint=checkpoint, dtype=edt)
    try:
        report = await compare_engines(engine, oracle, checkpoint, dtype=edt if edt in HALF else odt, **kw)
    finally:
        await engine.close()
        await oracle.close()
    out = report.to_dict()
    caps = engine.capabilities()
    out["capabilities"] = {f: {"status": s.status.value, "reason": s.reason} for f, s in caps.features.items()}
    return out


def validate_cli(name: str | None, checkpoint: str | None, dtype: str = "float32") -> int:
    """Launch `name` in `dtype`, check it against the torch engine on `checkpoint` (tolerance derived for
    `dtype`), print one JSON line; 0 if all pass."""
    import asyncio
    import json

    if not name or not checkpoint:
        print("usage: workbench engines validate NAME --checkpoint DIR", file=sys.stderr)
        return 2
    report = asyncio.run(run_parity(name, checkpoint, dtype=dtype))
    print(json.dumps(report, sort_keys=True))
    return 0 if report.get("ok") else 1


async def time_requests(engine, make_requests, kind: str = "beam", repeats: int = 3) -> dict[str, float]:
    """Latency of one batch of requests (sequential repeats after one warm-up): median and min seconds."""
    run = engine.beam_search if kind == "beam" else engine.score
    await run(make_requests())  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = await run(make_requests())
        times.append(time.perf_counter() - t0)
        if not all(r.success for r in res):
            raise RuntimeError(f"{getattr(engine, 'name', '?')} failed: {next(r.error for r in res if not r.success)}")
    return {"median_s": float(np.median(times)), "min_s": float(np.min(times)), "repeats": repeats}


# ---- engines side by side (notebook 03) -------------------------------------------------------------
# workload name -> (request kind, the feature an engine must offer to run it, or None)
FEATURE_WORKLOADS = {
    "beam": ("beam", None),
    "beam_constrained": ("beam", "trie_constraint"),
    "beam_soft_token": ("beam", "soft_token_beam_search"),
    "score_sequence": ("score", None),
}


def build_engines(names, checkpoint, urls: dict[str, str] | None = None) -> tuple[dict, dict[str, str]]:
    """Engines by name on `checkpoint` (`urls[name]`: an already running server); an engine that cannot
    start here is returned in the second dict with its reason, never hidden."""
    from workbench.engines import registry

    built, unavailable = {}, {}
    for name in names:
        url = (urls or {}).get(name)
        try:
            built[name] = (registry.engine_class(name)(checkpoint=checkpoint, url=url) if url
                           else registry.create_engine(name, checkpoint=checkpoint))
        except Exception as e:  # noqa: BLE001 - not installed here: recorded with the reason
            unavailable[name] = f"{type(e).__name__}: {e}"[:300]
    return built, unavailable


def feature_requests(checkpoint, n_prompts: int, prompt_len: int, beam_width: int,
                     n_candidates: int) -> dict[str, list]:
    """The requests of every FEATURE_WORKLOADS entry on `checkpoint` (synthetic prompts, catalog candidates),
    built once: every engine is timed on the same requests."""
    from workbench.model.checkpoint import read_catalog

    prompts = make_prompts(checkpoint, n_prompts, prompt_len)
    catalog = read_catalog(checkpoint)
    cands = tuple(tuple(catalog.sid_tokens(i)) for i in range(n_candidates))
    out = {}
    for wl in FEATURE_WORKLOADS:
        plist = prompts["soft"] if wl == "beam_soft_token" else prompts["plain"]
        out[wl] = ([ScoreRequest(p, cands) for p in plist] if wl == "score_sequence" else
                   [BeamSearchRequest(p, beam_width, catalog.depth, constrained=wl == "beam_constrained") for p in plist])
    return out


async def feature_latency(engines: dict, checkpoint, *, n_prompts: int, prompt_len: int, beam_width: int,
                          n_candidates: int, repeats: int) -> dict[str, dict]:
    """`"<engine>/<workload>"` -> `time_requests` stats for every engine and every workload it offers
    (a workload needing a feature the engine declares unsupported is left out; a failure is recorded)."""
    requests = feature_requests(checkpoint, n_prompts, prompt_len, beam_width, n_candidates)
    out = {}
    for name, eng in engines.items():
        caps = eng.capabilities()
        for wl, (kind, need) in FEATURE_WORKLOADS.items():
            if need and not caps.supports(need):
                continue
            try:
                out[f"{name}/{wl}"] = await time_requests(eng, lambda wl=wl: requests[wl], kind, repeats=repeats)
            except RuntimeError as e:
                out[f"{name}/{wl}"] = {"error": str(e)[:200]}
    return out
