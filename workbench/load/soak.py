"""`workbench soak`: a long run of mixed requests against `workbench serve`, with a derived memory bound.

What it does. It starts `workbench serve` on a checkpoint (or uses the server at `--url`), then sends `requests`
requests at `concurrency` in flight (closed loop: a new request leaves as soon as one returns), drawn from a fixed,
seeded mix of five kinds (`MIX`): beam search plain, trie-constrained (with banned items), with a soft token
(the user vector through the projector), label scoring and sequence scoring (catalog SIDs as candidates). Every
request is built by the one synthetic builder (`engines/workloads.py`), sent by the load generator's own sender
(`loadgen.warm_up` / `loadgen.run_point`) through the `workbench serve` client (`remote/http_engine.py`).
It reports:

- failures by kind: `http_<status>` (an error answer), `transport` (no answer), `timeout`, `malformed` (an answer
  that does not parse, or parses into the wrong shape: beam count, SID length, a constrained beam that is not an
  unbanned catalog item, score count, non-finite numbers, beams out of order);
- results outside the numeric bound: each answer against the same request answered by an in-process torch engine
  (the reference), compared by `engines/parity.py`'s beam rule (`compare_beams`) and, for scores, the largest
  |difference|, both against the rounding bound `engines/numerics.engine_bound` derives for the checkpoint, the
  prompts and the tokens summed (no tolerance of this module's own);
- resident memory of the server's process tree (VmRSS summed over the server and its children, read from /proc):
  at start (ready, before the first soak request), after warm-up, at the end, and sampled every
  `sample_every_s` in between; a progress line every `progress_every_s`; one JSON document and one summary line.

Warm-up. For each kind in turn, one wave of `concurrency` requests of that kind sent at once (so each kind has run
at the largest batch of its shape the concurrency allows: the scheduler admits them into the same forwards), then
one wave of `concurrency` mixed requests; `(kinds + 1) x concurrency` requests, counted apart from `requests`. After
it every code path of the mix has run (trie masks, banned counts, the projector, both score modes), every connection
the client will use has been opened, the metrics have their label sets, and the allocator has served the largest
homogeneous batches. The memory check compares the sampled peak after warm-up (end included) with the RSS
just after it.

The memory bound (derived from what the server's code keeps, not fitted to a run). After warm-up, nothing a request
brings may stay in the server once it is answered: the torch engine drops a job's prompt KV, beam state and banned
counts when it finishes (`engine.py`), clears its padded prompt-KV buffer when no request decodes
(`PromptKVBuffer.clear`), its counters are scalars, and its oneDNN GEMMs run at a fixed ladder of row counts whose
kernels it builds at load (`torch/onednn.py`, "Row counts"); the app keeps per-request state nowhere (the Prometheus
label sets are bounded by routes x statuses, and the histograms' buckets are fixed: `serving/metrics.py`); the client
sends token ids, so no tokenizer cache is filled (decoding the answers' text keeps no cache). What may still rise
after warm-up is the allocator's high-water mark, because a later forward can mix kinds in a way the warm-up did not
(prefill of some requests beside decode steps and score passes of others) and glibc keeps what it freed (`malloc.py`:
blocks up to 32 MiB stay in the heap, up to 256 MiB of free heap is kept). So

    growth(after warm-up -> any later sample) <= F + K + P + G

    F = C x max(Pp x (kv + act) + 8 H Pp^2,          a request's prompt in a prefill: its rows, and the
                                                     attention scores and probabilities of the prompt (float32)
                Nr x (kv + act + 16 H (Pk + T) + 32 V))   or its grid slots in a decode step / score pass: the
                                                     rows plus attention scores over prompt and own keys in
                                                     float32 (s1|s2, their concatenation, softmax, mask) and the
                                                     logits, their float64 copy, log-softmax and masked copy
        kv  = L x 2 x Hkv x D x s                    every layer's K/V of a row, kept to the forward's end
        act = s x (4 h + 3 (H + 2 Hkv) D + 3 I)      one layer's activations of a row (x, h, qkv, q|k, o,
                                                     gate|up, silu, down)
    K = 3 x C x L x 2 x Hkv x Pk x D x s             padded prompt KV: the decode buffer's 2 rows per request
                                                     (PromptKVBuffer) and one score pass's pad_prompt_kv
    P = 4 x C x (request + answer bytes)             the in-flight requests' JSON as Python objects (a parsed
                                                     number or id costs at most ~4x its text: object + slot)
    G = A x g                                        allocator granularity: each of the A server threads may own
                                                     a malloc arena whose top grows by whole pages: g = the
                                                     transparent huge page size (2 MiB) where the server runs
                                                     with the huge-page tunables (its /health says so), else
                                                     the 4 KiB page

with C the concurrency (each request in flight contributes at most one segment to a forward: its prompt, its
beams' decode step, or its candidates, hence C x the larger of the two), Nr = max(max(MIN_ROWS, B),
max(MIN_ROWS, K) x T) a request's grid slots (MIN_ROWS is the engine's smallest stream count), Pp the prompt
length, Pk = Pp + T rounded up to PROMPT_KV_BUCKET (the engine pads prompt KV so), B the beam width, K candidates
of T tokens (T = the SID depth, also the beam's new tokens), h / H / Hkv / D / I / L / V the model's hidden size,
heads, KV heads, head dim, intermediate size, layers and vocabulary, s the model dtype's bytes. Every term is an
upper bound on memory the code allocates and may keep in its heap; none is measured. The allocator's noise (pages
faulted in by a heap top that moved, an arena that a thread created late) is what `G` accounts for: one page of its
granularity per thread that can allocate. A leak is anything that grows with the number of requests: with
`requests` requests after the warm-up, one of more than `bound / requests` bytes per request fails the check.
What it looks like when it holds (random:0.1m, 10,000 requests at concurrency 64, 2-core Xeon, one server thread):
RSS rose 12 MiB in the first minute after warm-up (mixed batches the warm-up's waves did not form) and then stayed
at 555.0 MiB for the last 70 s, against a bound of 102 MiB.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from workbench.engines.base import BeamSearchRequest, ScoreRequest

# the fixed mix: kind -> weight (drawn with these probabilities from the seeded generator)
MIX: dict[str, float] = {"beam": 0.25, "beam_constrained": 0.25, "beam_soft": 0.2, "score_label": 0.15,
                         "score_sequence": 0.15}
BEAM_KINDS = ("beam", "beam_constrained", "beam_soft")
BANNED_PER_REQUEST = 3  # items a constrained request bans (drawn per request), so banned counts are built
LABELS = 2  # label tokens a label-scoring request reads
FAILURE_KINDS = ("http", "transport", "timeout", "malformed")
WARMUP_OFFSET = 1 << 30  # warm-up request indices start here: their prompts differ from the soak's


class SoakError(RuntimeError):
    """The soak cannot run as asked (a bad setting, a checkpoint the mix cannot use); the message says what to fix."""


@dataclass
class SoakSettings:
    requests: int = 10_000
    concurrency: int = 64
    seed: int = 0
    prompt_tokens: int = 24
    beam_width: int = 8
    candidates: int = 20
    dtype: str = "float32"
    threads: int | None = 1  # the server's OMP_NUM_THREADS (None: its default)
    request_timeout_s: float = 120.0
    sample_every_s: float = 0.25
    progress_every_s: float = 10.0
    reference_batch: int = 64  # requests per call to the in-process reference engine

    def check(self) -> None:
        if self.requests < 1:
            raise SoakError(f"--requests must be >= 1, got {self.requests}")
        if self.concurrency < 1:
            raise SoakError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.prompt_tokens < 3:
            raise SoakError(f"--prompt-tokens must be >= 3 (index token, soft-token placeholder, content), "
                            f"got {self.prompt_tokens}")
        if self.beam_width < 1 or self.candidates < 1:
            raise SoakError(f"--beam-width and --candidates must be >= 1, got {self.beam_width}, {self.candidates}")


# ---- the requests ---------------------------------------------------------------------------------


class SoakMix:
    """The soak's requests: request `i` is of kind `kinds[i]` (the seeded mix), built by that kind's synthetic
    workload at index `i` (a unique prompt per index). `warmup(n, concurrency)` is the warm-up's source."""

    kind = "mixed"

    def __init__(self, checkpoint, settings: SoakSettings, kinds: dict[str, float] | None = None):
        from workbench.engines.workloads import SyntheticWorkload, WorkloadShape
        from workbench.model.checkpoint import read_catalog, read_meta

        self.settings = s = settings
        meta = read_meta(checkpoint)
        self.catalog = read_catalog(checkpoint)
        self.depth = self.catalog.depth
        mix = dict(MIX if kinds is None else kinds)
        self.left_out: dict[str, str] = {}
        if meta.user_vector_dim is None and "beam_soft" in mix:
            mix.pop("beam_soft")
            self.left_out["beam_soft"] = "the checkpoint has no soft-token projector (a `none`-style checkpoint)"
        self.kinds = tuple(mix)
        weights = np.array([mix[k] for k in self.kinds], dtype=float)
        self.weights = weights / weights.sum()
        beam = WorkloadShape("beam_search", s.prompt_tokens, beam_width=s.beam_width, max_new_tokens=self.depth,
                             seed=s.seed)
        score = WorkloadShape("scoring", s.prompt_tokens, candidates=s.candidates, candidate_tokens=self.depth,
                              seed=s.seed)
        self._plain = SyntheticWorkload.from_checkpoint(beam, checkpoint, soft_token=False)
        self._constrained = SyntheticWorkload.from_checkpoint(replace(beam, constrained=True, seed=s.seed + 1),
                                                              checkpoint, soft_token=False)
        self._soft = (SyntheticWorkload.from_checkpoint(replace(beam, seed=s.seed + 2), checkpoint, soft_token=True)
                      if "beam_soft" in self.kinds else None)
        self._score = SyntheticWorkload.from_checkpoint(score, checkpoint, soft_token=False)
        rng = np.random.default_rng([s.seed, 7])
        base = meta.layout.base_vocab_size
        self.labels = tuple(int(x) for x in rng.choice(base - 2, LABELS, replace=False) + 2)
        self.sequence = np.random.default_rng([s.seed, 11]).choice(len(self.kinds), size=s.requests, p=self.weights)

    def kind_of(self, index: int) -> str:
        if index >= WARMUP_OFFSET:
            i = index - WARMUP_OFFSET
            wave = i // self.settings.concurrency
            return self.kinds[wave] if wave < len(self.kinds) else self.kinds[i % len(self.kinds)]
        return self.kinds[int(self.sequence[index])]

    def request(self, index: int) -> BeamSearchRequest | ScoreRequest:
        kind = self.kind_of(index)
        rid = f"{'w' if index >= WARMUP_OFFSET else 's'}{index % WARMUP_OFFSET}-{kind}"
        if kind == "beam":
            return replace(self._plain.request(index), request_id=rid)
        if kind == "beam_soft":
            return replace(self._soft.request(index), request_id=rid)
        if kind == "beam_constrained":
            rng = np.random.default_rng([self.settings.seed, index, 3])
            banned = tuple(int(x) for x in rng.choice(self.catalog.n_items, BANNED_PER_REQUEST, replace=False))
            return replace(self._constrained.request(index), banned_items=banned, request_id=rid)
        req = self._score.request(index)
        if kind == "score_label":
            return replace(req, mode="label", label_token_ids=self.labels, request_id=rid)
        return replace(req, request_id=rid)

    def warmup_count(self) -> int:
        return (len(self.kinds) + 1) * self.settings.concurrency


# ---- what came back -------------------------------------------------------------------------------


class Recorder:
    """Wraps an engine: every result is kept by request id (the load generator's records keep no answers)."""

    def __init__(self, engine):
        self.engine = engine
        self.results: dict[str, object] = {}
        self.done = 0

    def _keep(self, reqs, results):
        for r, x in zip(reqs, results):
            self.results[r.request_id] = x
        self.done += len(reqs)
        return results

    async def beam_search(self, requests):
        return self._keep(requests, await self.engine.beam_search(requests))

    async def score(self, requests):
        return self._keep(requests, await self.engine.score(requests))


def failure_kind(error: str) -> str:
    """Which of FAILURE_KINDS a failed record's error is (the HTTP client's and the load generator's wording)."""
    from workbench.load.loadgen import TIMEOUT_ERROR

    if error.startswith(TIMEOUT_ERROR):
        return "timeout"
    if error.startswith("HTTP transport error"):
        return "transport"
    if error.startswith("HTTP "):
        return "http_" + error.split()[1].rstrip(":")
    return "malformed"  # the client raised on the answer (a missing key, a wrong type, not JSON)


def malformed(req, res, mix: SoakMix) -> str | None:
    """Why a successful answer has the wrong shape for its request, or None."""
    if isinstance(req, BeamSearchRequest):
        if len(res.beams) != req.beam_width:
            return f"{len(res.beams)} beams for beam width {req.beam_width}"
        cums = [b.cum_logprob for b in res.beams]
        if not all(math.isfinite(c) for c in cums):
            return "a non-finite cum_logprob"
        if any(a < b for a, b in zip(cums, cums[1:])):
            return "beams not best first"
        for b in res.beams:
            if len(b.token_ids) != req.max_new_tokens:
                return f"a beam of {len(b.token_ids)} tokens for max_new_tokens {req.max_new_tokens}"
            if req.constrained:
                item = mix.catalog.item_of(b.token_ids)
                if item is None:
                    return f"constrained beam {b.token_ids} is not a catalog SID"
                if item in req.banned_items:
                    return f"constrained beam {b.token_ids} is banned item {item}"
        return None
    if len(res.scores) != len(req.candidates):
        return f"{len(res.scores)} scores for {len(req.candidates)} candidates"
    flat = np.asarray(res.scores, dtype=float)
    if req.mode == "label" and flat.shape != (len(req.candidates), len(req.label_token_ids)):
        return f"label scores of shape {flat.shape}, expected {(len(req.candidates), len(req.label_token_ids))}"
    if not np.isfinite(flat).all():
        return "a non-finite score"
    return None


# ---- memory -----------------------------------------------------------------------------------------


def _status(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return kids


def tree_memory(pid: int) -> dict[str, int]:
    """{"rss", "anon", "threads", "processes"} of `pid` and all its descendants (bytes; /proc, Linux)."""
    todo, seen = [pid], []
    rss = anon = threads = 0
    while todo:
        p = todo.pop()
        try:
            st = _status(p)
        except OSError:
            continue
        seen.append(p)
        rss += int(st.get("VmRSS", "0 kB").split()[0]) * 1024
        anon += int(st.get("RssAnon", "0 kB").split()[0]) * 1024
        threads += int(st.get("Threads", "1"))
        todo += _children(p)
    return {"rss": rss, "anon": anon, "threads": threads, "processes": len(seen)}


def _hugepage_bytes() -> int:
    try:
        return int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 2 << 20


@dataclass
class MemoryBound:
    """The terms of the module docstring's bound, in bytes, and what they were computed from."""

    forward: int
    prompt_kv: int
    python: int
    allocator: int
    inputs: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.forward + self.prompt_kv + self.python + self.allocator


def memory_bound(config, settings: SoakSettings, depth: int, dtype_bytes: int, threads: int, hugepages: bool,
                 request_bytes: int, answer_bytes: int) -> MemoryBound:
    """The bound of the module docstring for a model `config` (a transformers config) and these settings."""
    from workbench.engines.torch.layers import MIN_ROWS
    from workbench.engines.torch.segments import PROMPT_KV_BUCKET

    s, c, pp, t = dtype_bytes, settings.concurrency, settings.prompt_tokens, depth
    h, n_layers = int(config.hidden_size), int(config.num_hidden_layers)
    heads, hkv = int(config.num_attention_heads), int(config.num_key_value_heads)
    d = int(getattr(config, "head_dim", None) or h // heads)
    inter, vocab = int(config.intermediate_size), int(config.vocab_size)
    pk = -(-(pp + t) // PROMPT_KV_BUCKET) * PROMPT_KV_BUCKET
    kv = n_layers * 2 * hkv * d * s
    act = s * (4 * h + 3 * (heads + 2 * hkv) * d + 3 * inter)
    slots = max(max(MIN_ROWS, settings.beam_width), max(MIN_ROWS, settings.candidates) * t)
    prefill = pp * (kv + act) + 8 * heads * pp * pp
    shared = slots * (kv + act + 16 * heads * (pk + t) + 32 * vocab)
    forward = c * max(prefill, shared)
    prompt_kv = 3 * c * n_layers * 2 * hkv * pk * d * s
    python = 4 * c * (request_bytes + answer_bytes)
    page = _hugepage_bytes() if hugepages else os.sysconf("SC_PAGE_SIZE")
    inputs = {"concurrency": c, "request_slots": slots, "prefill_bytes_per_request": prefill,
              "shared_bytes_per_request": shared, "prompt_tokens": pp, "prompt_kv_len": pk, "sid_depth": t,
              "beam_width": settings.beam_width, "candidates": settings.candidates, "hidden": h, "layers": n_layers,
              "heads": heads, "kv_heads": hkv, "head_dim": d, "intermediate": inter, "vocab": vocab,
              "dtype_bytes": s, "threads": threads, "page_bytes": page, "request_bytes": request_bytes,
              "answer_bytes": answer_bytes}
    return MemoryBound(forward, prompt_kv, python, threads * page, inputs)


def _body_sizes(mix: SoakMix) -> tuple[int, int]:
    """The largest request and answer bodies of the mix, in JSON bytes (the answers as the server shapes them:
    every number written at full float precision)."""
    req_max = ans_max = 0
    for k in range(len(mix.kinds)):  # warm-up wave k is all of kind k
        r = mix.request(WARMUP_OFFSET + k * mix.settings.concurrency)
        body = {"prompt": list(r.prompt.token_ids), "user_vector": list(r.prompt.user_vector or ()),
                "items": [list(c) for c in getattr(r, "candidates", ())]}
        req_max = max(req_max, len(json.dumps(body)))
        if isinstance(r, BeamSearchRequest):
            choice = {"index": 0, "text": "x" * 16 * r.max_new_tokens, "logprobs": None, "finish_reason": "length",
                      "stop_reason": None, "token_ids": [99999] * r.max_new_tokens, "cum_logprob": -1.2345678901234567}
            ans = {"choices": [choice] * r.beam_width}
        else:
            per = [-1.2345678901234567] * (len(r.label_token_ids) or 1)
            ans = {"scores": [per] * len(r.candidates), "token_logprobs": [per] * len(r.candidates)}
        ans_max = max(ans_max, len(json.dumps(ans)) + 200)
    return req_max, ans_max


# ---- the reference ------------------------------------------------------------------------------------


async def compare_with_reference(reference, requests: list, results: dict, batch: int,
                                 skip: frozenset = frozenset()) -> dict:
    """Per kind: answers compared, answers outside the bound (with the worst), the bound and the largest
    difference. `reference` is an in-process torch engine on the same checkpoint and dtype."""
    from workbench.engines.numerics import engine_bound
    from workbench.engines.parity import compare_beams

    by_kind: dict[str, list] = {}
    for r in requests:
        res = results.get(r.request_id)
        if res is not None and res.success and r.request_id not in skip:
            by_kind.setdefault(r.request_id.split("-", 1)[1], []).append((r, res))
    out = {}
    dtype = reference.dtype
    for kind, pairs in by_kind.items():
        reqs = [r for r, _ in pairs]
        steps = reqs[0].max_new_tokens if isinstance(reqs[0], BeamSearchRequest) else max(len(c) for c in
                                                                                          reqs[0].candidates)
        tol = engine_bound(reference, [r.prompt for r in reqs], steps, dtype)
        outside, worst, examples = 0, 0.0, []
        for i in range(0, len(pairs), batch):
            chunk = pairs[i : i + batch]
            run = reference.beam_search if isinstance(chunk[0][0], BeamSearchRequest) else reference.score
            want = await run([r for r, _ in chunk])
            for (r, got), w in zip(chunk, want):
                if not w.success:
                    ok, d, why = False, float("inf"), f"reference failed: {w.error}"
                elif isinstance(r, BeamSearchRequest):
                    ok, d, why = compare_beams(got.beams, w.beams, tol)
                else:
                    d = float(np.max(np.abs(np.asarray(got.scores, float) - np.asarray(w.scores, float))))
                    ok, why = d <= tol, f"scores differ by {d:.2e}"
                worst = max(worst, d)
                if not ok:
                    outside += 1
                    if len(examples) < 3:
                        examples.append(f"{r.request_id}: {why}")
        out[kind] = {"compared": len(pairs), "outside_bound": outside, "bound": tol, "max_abs_diff": worst,
                     "examples": examples}
    return out


# ---- the run --------------------------------------------------------------------------------------------


@dataclass
class SoakResult:
    settings: dict
    checkpoint: str
    server: str
    kinds: dict
    left_out: dict
    requests: int
    sent: int
    warmup_requests: int
    wall_s: float
    failures: dict
    failure_examples: list
    outside_bound: int
    parity: dict
    memory: dict
    bound: dict
    ok: bool
    why: list

    def to_json(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        m = self.memory
        mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
        fails = sum(self.failures.values())
        mem = (f"server RSS start {mib(m['start'])} / warm {mib(m['warm'])} / end {mib(m['end'])} MiB, growth after "
               f"warm-up {mib(m['growth'])} MiB (peak) vs bound {mib(self.bound['total'])} MiB" if m["measured"]
               else f"memory not measured ({m['why']})")
        return (f"[soak] {'OK' if self.ok else 'FAILED'}: {self.sent}/{self.requests} requests in {self.wall_s:.1f} s "
                f"(+{self.warmup_requests} warm-up), failures {fails} {self.failures or ''}, outside the bound "
                f"{self.outside_bound}; {mem}" + (f"; {'; '.join(self.why)}" if self.why else ""))


class _Sampler:
    """RSS of the server tree every `every_s`, each sample tagged with its phase; a progress line now and then."""

    def __init__(self, pid: int | None, recorder: Recorder, every_s: float, progress_every_s: float, total: int):
        self.pid, self.recorder, self.every_s = pid, recorder, every_s
        self.progress_every_s, self.total = progress_every_s, total
        self.samples: list[tuple[float, str, int]] = []
        self.phase = "start"
        self.t0 = time.perf_counter()
        self.base_done = 0

    def sample(self) -> int | None:
        if self.pid is None:
            return None
        rss = tree_memory(self.pid)["rss"]
        self.samples.append((time.perf_counter() - self.t0, self.phase, rss))
        return rss

    async def run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(self.every_s)
            rss = self.sample()
            if self.progress_every_s and time.perf_counter() - last >= self.progress_every_s:
                last = time.perf_counter()
                done = self.recorder.done - self.base_done
                fails = sum(1 for r in self.recorder.results.values() if not r.success)
                mem = "" if rss is None else f", server RSS {rss / 2**20:.1f} MiB"
                what = f"{done}/{self.total}" if self.phase == "soak" else f"{self.recorder.done} warm-up"
                print(f"[soak] {self.phase}: {what} answered, {fails} failed{mem}", file=sys.stderr, flush=True)


async def soak(engine, checkpoint, settings: SoakSettings, pid: int | None, hugepages: bool,
               server: str, kinds: dict[str, float] | None = None) -> SoakResult:
    """Warm up, soak, compare with the reference, check memory (the module docstring); `engine` is a connected
    `HTTPEngine` on the server whose process is `pid` (None: memory not measured)."""
    from workbench.engines.registry import create_engine
    from workbench.load.loadgen import run_point, warm_up

    mix = SoakMix(checkpoint, settings, kinds)
    rec = Recorder(engine)
    sampler = _Sampler(pid, rec, settings.sample_every_s, settings.progress_every_s, settings.requests)
    start = sampler.sample()
    task = asyncio.create_task(sampler.run())
    try:
        sampler.phase = "warm-up"
        n_warm = mix.warmup_count()
        warm_records = await warm_up(rec, mix, n_warm, first_index=WARMUP_OFFSET, concurrency=settings.concurrency,
                                     timeout_s=settings.request_timeout_s)
        warm = sampler.sample()
        sampler.phase, sampler.base_done = "soak", rec.done
        t0 = time.perf_counter()
        point = await run_point(rec, mix, float("inf"), n_requests=settings.requests, first_index=0,
                                concurrency=settings.concurrency, time_cap_s=float("inf"),
                                request_timeout_s=settings.request_timeout_s, seed=settings.seed)
        wall = time.perf_counter() - t0
        sampler.phase = "end"
        end = sampler.sample()
    finally:
        task.cancel()
    threads = tree_memory(pid)["threads"] if pid is not None else 0

    failures: dict[str, int] = {}
    examples: list[str] = []
    requests = [mix.request(r.index) for r in point.records]
    bad_shape: set[str] = set()
    for rec_ in list(warm_records) + list(point.records):
        req = mix.request(rec_.index)
        why = None
        if not rec_.success:
            kind = failure_kind(rec_.error or "")
            why = rec_.error
        else:
            res = rec.results.get(req.request_id)
            bad = malformed(req, res, mix) if res is not None else "no answer kept"
            kind, why = ("malformed", bad) if bad else (None, None)
            if bad:
                bad_shape.add(req.request_id)
        if kind:
            failures[kind] = failures.get(kind, 0) + 1
            if len(examples) < 5:
                examples.append(f"{req.request_id}: {why}"[:300])

    reference = create_engine("torch", checkpoint=checkpoint, dtype=settings.dtype)
    try:
        parity = await compare_with_reference(reference, requests, rec.results, settings.reference_batch,
                                              frozenset(bad_shape))
    finally:
        await reference.close()
    outside = sum(p["outside_bound"] for p in parity.values())

    memory: dict = {"measured": pid is not None}
    bound: dict = {}
    why: list[str] = []
    if failures:
        why.append(f"{sum(failures.values())} failures")
    if outside:
        why.append(f"{outside} results outside the numeric bound")
    if point.not_sent:
        why.append(f"{point.not_sent} requests not sent")
    if pid is not None:
        after = [rss for _, phase, rss in sampler.samples if phase in ("soak", "end")]
        growth = max(after) - warm
        req_b, ans_b = _body_sizes(mix)
        mb = memory_bound(reference.checkpoint.model.config, settings, mix.depth,
                          _dtype_bytes(settings.dtype), threads, hugepages, req_b, ans_b)
        bound = {"total": mb.total, "forward": mb.forward, "prompt_kv": mb.prompt_kv, "python": mb.python,
                 "allocator": mb.allocator, "inputs": mb.inputs}
        memory.update(start=start, warm=warm, end=end, peak_after_warmup=max(after), growth=growth,
                      end_growth=end - warm, samples=[(round(t, 3), p, r) for t, p, r in sampler.samples])
        if growth > mb.total:
            why.append(f"server RSS grew {growth / 2**20:.1f} MiB after warm-up, over the derived bound "
                       f"{mb.total / 2**20:.1f} MiB")
    else:
        memory.update(start=0, warm=0, end=0, growth=0, why="no server process to read (--url without --pid)")
        bound = {"total": 0}
    return SoakResult(
        settings=asdict(settings), checkpoint=str(checkpoint), server=server,
        kinds={k: int((mix.sequence == i).sum()) for i, k in enumerate(mix.kinds)}, left_out=mix.left_out,
        requests=settings.requests, sent=len(point.records), warmup_requests=n_warm, wall_s=wall,
        failures=failures, failure_examples=examples, outside_bound=outside, parity=parity, memory=memory,
        bound=bound, ok=not why, why=why,
    )


def _dtype_bytes(dtype: str) -> int:
    return {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}[dtype]


def run_soak(checkpoint, settings: SoakSettings, url: str | None = None, pid: int | None = None,
             kinds: dict[str, float] | None = None, log_path=None) -> SoakResult:
    """Start `workbench serve` on `checkpoint` (unless `url` names a running one, whose process is `pid`), soak it,
    stop it; return the result."""
    from workbench.engines.remote.http_engine import HTTPEngine
    from workbench.engines.remote.launcher import launch, workbench_serve_spec
    from workbench.hardware import resolve_dtype
    from workbench.sync import run_sync

    settings.check()
    settings.dtype = resolve_dtype(settings.dtype, "torch")

    async def go(u: str, p: int | None) -> SoakResult:
        engine = HTTPEngine(u, timeout_s=settings.request_timeout_s, max_connections=max(settings.concurrency, 1))
        try:
            # the server says whether it runs with the huge-page malloc tunables (the bound's page size)
            hugepages = bool((await engine.health()).get("malloc_hugepages", True))
            return await soak(engine, checkpoint, settings, p, hugepages, u, kinds)
        finally:
            await engine.close()

    if url is not None:
        return run_sync(go(url, pid))
    spec = workbench_serve_spec(checkpoint, dtype=settings.dtype, threads=settings.threads)
    with launch(spec, log_path=log_path) as server:
        print(f"[soak] workbench serve pid {server.pid} at {server.url} (ready after {server.started_s:.1f} s)",
              file=sys.stderr, flush=True)
        return run_sync(go(server.url, server.pid))


def resolve(spec: str, folder: Path) -> Path:
    """A checkpoint folder for `spec`: a path, or `random:<size>` (random_checkpoint.SIZES) written under `folder`
    with a soft-token projector, so the whole mix runs."""
    from workbench.errors import UsageError

    if spec.startswith("random:"):
        from workbench.model.random_checkpoint import make_random_checkpoint, random_size

        try:
            size = random_size(spec.split(":", 1)[1], for_disk=True)
        except ValueError as e:
            raise UsageError(str(e)) from None
        return make_random_checkpoint(folder / "checkpoint", **size.checkpoint_kwargs(), soft_token=True, seed=0)
    p = Path(spec).expanduser()
    if not (p / "workbench.json").exists():
        raise UsageError(f"{spec} is not a workbench checkpoint (no workbench.json); give a trained checkpoint "
                         "folder or random:<size> (0.1m, 2.4m, 25m)")
    return p.resolve()


def main(args) -> int:
    """`workbench soak` (cli.py parses the flags): 0 when the soak held (no failure, nothing outside the numeric
    bound, memory within the derived bound), 1 otherwise; the JSON result is the last line of stdout."""
    import tempfile

    if args.pid is not None and args.url is None:
        from workbench.errors import UsageError

        raise UsageError("--pid names the process of the server at --url; give --url too (without --url the soak "
                         "starts its own server and knows its process)")
    settings = SoakSettings(requests=args.requests, concurrency=args.concurrency, seed=args.seed,
                            prompt_tokens=args.prompt_tokens, beam_width=args.beam_width, candidates=args.candidates,
                            dtype=args.dtype, threads=args.threads, request_timeout_s=args.request_timeout)
    try:
        settings.check()
    except SoakError as e:
        from workbench.errors import UsageError

        raise UsageError(str(e)) from None
    with tempfile.TemporaryDirectory(prefix="workbench-soak-") as tmp:
        checkpoint = resolve(args.checkpoint, Path(tmp))
        result = run_soak(checkpoint, settings, url=args.url, pid=args.pid, log_path=Path(tmp) / "server.log")
    doc = result.to_json()
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(result.line(), file=sys.stderr)
    doc["memory"].pop("samples", None)  # the file has them; stdout stays one readable line
    print(json.dumps(doc))
    return 0 if result.ok else 1
