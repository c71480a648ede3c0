"""The workbench's own engine: beam search, multi-item scoring and soft tokens on one fast path.

How it works (see model.py for the forward and its attention, segments.py for the row layouts a step's
requests take in it, search.py for the tensor math of a step: trie mask, beam selection, scores; this module is
the scheduler and the per-request state around them):

- A worker thread owns the model. Async callers enqueue jobs and await futures, so concurrent
  requests from many coroutines (or HTTP clients) meet in the same forwards.
- Each scheduler iteration runs ONE forward over a mix of work, bounded by `max_batch_tokens`:
  the prompts of newly admitted requests (prefill), one decode step for every live beam of every
  active beam-search request, and the candidates of score requests whose prompt is cached.
- A prompt is prefilled once per request. Its KV cache is shared by all beams (decode attends to
  [shared prompt KV | the beam's own generated KV]); beams only carry their few generated tokens.
- Beam search keeps the top `beam_width` continuations by cumulative log-prob (no length penalty,
  no EOS), like `generate(num_beams=n, length_penalty=0)`; all beams are returned, best first.
  The catalog constraint is a vectorized allowed-token mask from the prefix trie (banned items
  included); log-probs are the model's full-vocabulary log-probs (the mask does not renormalize).
- Multi-item scoring: candidates are streams against the shared prompt KV, each attending only to
  the prompt and itself, positions restarting right after the prompt.
- Soft token: the checkpoint's projector maps the user vector to an embedding row that replaces
  the `<|user|>` placeholder's embedding before the first forward. A row that is not finite in the
  model's dtype (an absurdly scaled vector) fails its request alone, before the forward.

Every request is validated first; a bad request gets `success=False` and a message, never an
exception that would abort its batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from workbench.engines.base import (
    BeamSearchRequest,
    BeamSearchResult,
    Capabilities,
    FeatureSupport,
    Limits,
    RequestError,
    ScoreRequest,
    ScoreResult,
    Support,
    Timings,
    dtype_max,
    validate_beam_request,
    validate_score_request,
)
from workbench.engines.checks import require_device, validate_constraint, validate_projected
from workbench.engines.torch.options import variant_name
from workbench.engines.torch.search import (
    banned_counts_by_depth,
    beams_of,
    candidate_scores,
    constraint_mask,
    reorder_own_kv,
    row_offsets,
    select_beams,
    select_beams_stacked,
)
from workbench.engines.torch.segments import (
    KVLayout,
    PrefillSegment,
    PromptKVBuffer,
    decode_segment,
    pad_prompt_kv,
    score_segment,
)
from workbench.hardware import sync


def _import_torch():
    import torch

    return torch


@dataclass
class EngineStats:
    """Counters the benchmark reads (reset with `TorchEngine.reset_stats`)."""

    forwards: int = 0
    rows: int = 0  # token rows through the linear layers
    prefill_tokens: int = 0
    decode_rows: int = 0
    score_rows: int = 0
    peak_kv_bytes: int = 0  # KV cache bytes held at once (shared prompt KV + per-beam KV)
    peak_kv_bytes_if_copied: int = 0  # what the same beams would hold with one prompt copy per beam
    busy_s: float = 0.0


_SERIAL = itertools.count()


@dataclass(eq=False)
class _Job:
    kind: str  # "beam" | "score"
    req: object
    timings: Timings
    future: concurrent.futures.Future
    # prompt state
    prompt_kv: list | None = None  # per layer (k, v) [Hkv, P, D]
    first_logprobs: object = None  # [vocab] log-probs after the prompt
    # beam state
    tokens: object = None  # [B_live, s] LongTensor of generated tokens
    cum: object = None  # [B_live] in FastLM.logprob_dtype (float64 on the CPU, float32 on a GPU)
    own_kv: list | None = None  # per layer (k, v) [B_live, Hkv, s-1, D]
    banned_counts: list | None = None  # per depth [1, n_nodes] banned leaves under each trie node
    parents: object = None  # [B_live] parent beam of each beam after the last selection
    done: bool = False
    serial: int = field(default_factory=lambda: next(_SERIAL))

    @property
    def prompt_len(self) -> int:
        return len(self.req.prompt.token_ids)


class TorchEngine:
    """In-process engine over a workbench checkpoint (see the module docstring)."""

    name = "torch"

    def __init__(
        self,
        checkpoint,
        dtype: str = "float32",
        device: str = "cpu",
        max_batch_tokens: int = 8192,
        max_beam_width: int = 64,
        max_new_tokens: int = 64,
        max_candidates: int = 1024,
        max_candidate_tokens: int = 64,
        num_threads: int | None = None,
        batch_invariant: bool = False,
        compile: bool = False,
        quantize: str | None = None,
        gemm: str = "auto",
    ):
        """`batch_invariant`: fixed-size GEMM row blocks so results are identical whatever shares a
        batch, also with several BLAS threads (opt-in: costs up to ~2x on small decode batches).
        `compile`: the per-layer elementwise work as fused torch.compile kernels, compiled and warmed up
        here (fused.py; eager with a warning where compiling fails).
        `quantize="int8"`: dynamic int8 layer GEMMs, float32 only (int8.py).
        Both are off by default; either one names the engine apart (`variant_name`).
        `gemm`: the layer GEMMs' library: "auto" (packed oneDNN where it is faster than F.linear: float32 where it
        measures clearly faster at load, bfloat16 wherever oneDNN has the kernel; onednn.py; the choice is
        `self.lm.gemm`, why `self.lm.gemm_why`), "default", "onednn"."""
        torch = _import_torch()
        from workbench.model.checkpoint import LoadedCheckpoint, load_checkpoint
        from workbench.engines.torch.model import FastLM, check_options

        device = require_device(device)  # a GPU this machine lacks: DeviceError, before anything loads
        check_options(getattr(torch, dtype), device, batch_invariant, quantize)  # before the checkpoint loads
        if num_threads:
            torch.set_num_threads(int(num_threads))
        ck = checkpoint if isinstance(checkpoint, LoadedCheckpoint) else load_checkpoint(checkpoint, dtype=dtype, device=device)
        self.checkpoint = ck
        self.dtype = dtype
        self.device = torch.device(device)
        self.lm = FastLM(ck.model, device=self.device, dtype=getattr(torch, dtype), batch_invariant=batch_invariant,
                         compile=compile, quantize=quantize, gemm=gemm)
        # what actually runs: a compile that fell back to eager is plain "torch" again
        self.name = variant_name(self.lm.compiled, quantize)
        self._kv = KVLayout.of(self.lm, self.device)
        self.projector = ck.projector.to(self.device) if ck.projector is not None else None
        self.catalog = ck.catalog
        self.trie = ck.catalog.trie().to(self.device)  # the per-step masks are built on the device (search.py)
        self.max_batch_tokens = int(max_batch_tokens)
        layout = ck.meta.layout
        self.limits = Limits(
            max_prompt_tokens=ck.max_positions,
            vocab_size=self.lm.vocab_size,
            max_beam_width=max_beam_width,
            max_new_tokens=max_new_tokens,
            max_candidates=max_candidates,
            max_candidate_tokens=max_candidate_tokens,
            user_vector_dim=ck.meta.user_vector_dim if self.projector is not None else None,
            placeholder_id=layout.placeholder_id,
            # the vector enters the projector in float32 (load_projector), its output the model in `dtype`
            max_abs_user_value=dtype_max("float32", dtype),
            dtype=dtype,
        )
        self.stats = EngineStats()
        # Called by the worker thread after each forward with (requests in it, token rows in it): the server's
        # batch-size metrics. It must be cheap and thread-safe; an exception from it is swallowed (the
        # forward's requests must not fail for a metric).
        self.on_forward: Callable[[int, int], None] | None = None
        self._submitted = self._admitted = 0  # jobs queued / taken into a forward (queue_depth)
        self._submit_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._prompt_kv = PromptKVBuffer(self._kv)  # the decoding requests' padded prompt KV (worker thread only)

    # ---- capabilities ------------------------------------------------------------------------
    @staticmethod
    def static_capabilities() -> Capabilities:
        n = Support.NATIVE
        return Capabilities(
            engine="torch",
            features={
                "beam_search_all_beams": FeatureSupport(n, "in-engine beam search, prompt KV shared by all beams"),
                "trie_constraint": FeatureSupport(n, "vectorized prefix-trie mask per decode step, banned items"),
                "soft_token": FeatureSupport(n, "projector inside the engine replaces the placeholder embedding"),
                "soft_token_beam_search": FeatureSupport(n, "soft-token prompts work with beam search"),
                "multi_item_scoring": FeatureSupport(n, "one pass: candidates attend to the shared prompt KV and themselves"),
                "fanout_scoring": FeatureSupport(Support.EMULATED, "not needed: one pass returns the same scores"),
            },
        )

    def capabilities(self) -> Capabilities:
        caps = self.static_capabilities()
        feats = dict(caps.features)
        if self.projector is None:
            why = "this checkpoint has no soft-token projector"
            feats["soft_token"] = FeatureSupport(Support.UNSUPPORTED, why)
            feats["soft_token_beam_search"] = FeatureSupport(Support.UNSUPPORTED, why)
        return Capabilities(engine=self.name, features=feats)

    def prompt_logits(self, prompt):
        """Logits [L, vocab] of the prompt (soft token applied) through the engine's own forward.

        Synchronous and outside the scheduler: for parity checks against an HF forward.
        """
        from workbench.engines.base import BeamSearchRequest

        req = BeamSearchRequest(prompt, beam_width=1, max_new_tokens=1)
        validate_beam_request(req, self.limits)
        job = _Job("beam", req, Timings.start(), concurrent.futures.Future())
        h = self.lm.forward(self._prompt_embeds(job), [PrefillSegment([job.prompt_len])])
        return self.lm.logits(h)

    def reset_stats(self) -> None:
        self.stats = EngineStats()

    def queue_depth(self) -> int:
        """Requests submitted and not yet in a forward (their prompt not prefilled): the scheduler's queue.
        Read-only and lock-free (two counters, each written by one side), so a metrics scrape never waits
        for the worker; it may be one request off while a forward is being admitted."""
        return max(0, self._submitted - self._admitted)

    # ---- public async API --------------------------------------------------------------------
    async def beam_search(self, requests: Sequence[BeamSearchRequest]) -> list[BeamSearchResult]:
        futs = [self._submit("beam", r, self.validate_beam, BeamSearchResult) for r in requests]
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futs)))

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        futs = [self._submit("score", r, self.validate_score, ScoreResult) for r in requests]
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futs)))

    async def close(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    # ---- validation and submission -----------------------------------------------------------
    def validate_beam(self, r: BeamSearchRequest) -> None:
        validate_beam_request(r, self.limits)
        validate_constraint(r, self.catalog)

    def validate_score(self, r: ScoreRequest) -> None:
        validate_score_request(r, self.limits)

    def _submit(self, kind: str, r, validate: Callable, result_cls: type) -> concurrent.futures.Future:
        """Queue a `kind` ("beam" | "score") job; a closed engine or a bad request resolves at once to
        a `result_cls` with `success=False` and the message."""
        t = Timings.start()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            if self._closed:
                raise RequestError("engine is closed")
            validate(r)
        except RequestError as e:
            fut.set_result(result_cls(r.request_id, success=False, error=str(e), timings=t.finish(),
                                      prompt_tokens=len(r.prompt.token_ids)))
            return fut
        self._enqueue(_Job(kind, r, t, fut))
        return fut

    def _enqueue(self, job: _Job) -> None:
        with self._submit_lock:  # callers may be on several threads; the worker only reads this
            self._submitted += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._worker, name="torch-engine", daemon=True)
            self._thread.start()
        self._queue.put(job)

    # ---- the scheduler -----------------------------------------------------------------------
    def _worker(self) -> None:
        waiting: list[_Job] = []  # submitted, prompt not yet prefilled
        decoding: list[_Job] = []  # beam jobs with live beams
        scoring: list[_Job] = []  # score jobs with a cached prompt, candidates not yet run
        stop = False
        while not stop or waiting or decoding or scoring:
            block = not (waiting or decoding or scoring)
            try:
                while True:
                    item = self._queue.get(block=block, timeout=None)
                    block = False
                    if item is None:
                        stop = True
                    else:
                        waiting.append(item)
            except queue.Empty:
                pass
            if stop and not (waiting or decoding or scoring):
                break
            # Admission under the token budget: decode rows first (they hold KV), then score
            # candidates, then new prompts; always at least one unit of work.
            budget = self.max_batch_tokens
            dec = list(decoding)
            budget -= sum(int(j.tokens.shape[0]) for j in dec)
            sc: list[_Job] = []
            for j in list(scoring):
                n = sum(len(c) for c in j.req.candidates)
                if sc and n > budget:
                    break
                sc.append(j)
                budget -= n
            pre: list[_Job] = []
            for j in list(waiting):
                if (pre or dec or sc) and j.prompt_len > budget:
                    break
                pre.append(j)
                budget -= j.prompt_len
            if not (pre or dec or sc):
                continue
            self._admitted += len(pre)
            t0 = time.perf_counter()
            try:
                self._iteration(pre, dec, sc)
            except Exception as e:  # noqa: BLE001 - fail the jobs of this forward, keep serving
                msg = f"engine error in forward: {type(e).__name__}: {e}"
                for j in pre + dec + sc:
                    j.done = True
                    self._fail(j, msg)
            self.stats.busy_s += time.perf_counter() - t0
            waiting = [j for j in waiting if j not in pre]
            decoding = [j for j in decoding if not j.done] + [j for j in pre if j.kind == "beam" and not j.done]
            scoring = [j for j in scoring if not j.done] + [j for j in pre if j.kind == "score" and not j.done]
            if not decoding:
                self._prompt_kv.clear()  # idle: no padded prompt KV held for requests that are gone
            self._track_kv(decoding)

    def _fail(self, j: _Job, msg: str) -> None:
        if j.future.done():
            return
        t = j.timings.finish()
        if j.kind == "beam":
            j.future.set_result(BeamSearchResult(j.req.request_id, success=False, error=msg, timings=t,
                                                 prompt_tokens=j.prompt_len))
        else:
            j.future.set_result(ScoreResult(j.req.request_id, success=False, error=msg, timings=t,
                                            prompt_tokens=j.prompt_len))

    def _track_kv(self, decoding: list[_Job]) -> None:
        per_tok = self.lm.kv_bytes_per_token()
        held = copied = 0
        for j in decoding:
            b, s = j.tokens.shape
            held += per_tok * (j.prompt_len + b * max(s - 1, 0))
            copied += per_tok * b * (j.prompt_len + max(s - 1, 0))
        self.stats.peak_kv_bytes = max(self.stats.peak_kv_bytes, held)
        self.stats.peak_kv_bytes_if_copied = max(self.stats.peak_kv_bytes_if_copied, copied)

    # ---- one forward -------------------------------------------------------------------------
    def _iteration(self, pre: list[_Job], dec: list[_Job], sc: list[_Job]) -> None:
        torch = _import_torch()

        lm = self.lm
        embeds = self._admit_prompts(pre)
        pre = [j for j in pre if j in embeds]
        if not (pre or dec or sc):
            return
        xs, segments = [], []
        if pre:
            xs.append(torch.cat([embeds[j] for j in pre]))
            segments.append(PrefillSegment([j.prompt_len for j in pre]))
        dec_seg = sc_seg = None
        if dec:
            dec_seg, x = self._decode_segment(dec)
            xs.append(x)
            segments.append(dec_seg)
        if sc:
            sc_seg, x = self._score_segment(sc)
            xs.append(x)
            segments.append(sc_seg)
        x = torch.cat(xs) if len(xs) > 1 else xs[0]
        h = lm.forward(x, segments)
        self.stats.forwards += 1
        self.stats.rows += int(x.shape[0])
        self._report_forward(len(pre) + len(dec) + len(sc), int(x.shape[0]))
        off = 0
        if pre:
            seg = segments[0]
            n = seg.n_rows
            last = torch.cumsum(torch.as_tensor(seg.lengths, device=h.device), 0) - 1
            lp = lm.log_probs(h[last])  # [n_prompts, vocab]
            sync(self.device)  # the first token's time is when its log-probs exist, not when their kernels launched
            now = time.perf_counter()
            for i, j in enumerate(pre):
                j.prompt_kv = [kv[i] for kv in seg.kv]
                j.first_logprobs = lp[i]
                j.timings.first_token = now
            self.stats.prefill_tokens += n
            off += n
            for j in pre:
                if j.kind == "beam":
                    self._first_step(j)
        if dec:
            n = dec_seg.n_rows
            self._decode_step(dec, dec_seg, h[off : off + n])
            self.stats.decode_rows += n
            off += n
        if sc:
            n = sc_seg.n_rows
            self._finish_scores(sc, sc_seg, h[off : off + n])
            self.stats.score_rows += n
            off += n

    def _report_forward(self, requests: int, rows: int) -> None:
        hook = self.on_forward
        if hook is not None:
            try:
                hook(requests, rows)
            except Exception:  # noqa: BLE001 - a metric must never fail the forward's requests
                pass

    def _admit_prompts(self, pre: list[_Job]) -> dict:
        """{job: prompt embeddings} for the jobs of `pre` whose prompt can run; a job whose projected user
        vector overflows the dtype fails here, alone, before its inf/NaN row enters a forward shared with
        other requests."""
        out = {}
        for j in pre:
            try:
                out[j] = self._prompt_embeds(j)
            except RequestError as e:
                j.done = True
                self._fail(j, str(e))
        return out

    def _prompt_embeds(self, j: _Job):
        """[L, hidden] embeddings of j's prompt, the projected user vector at the placeholder (RequestError
        when the projection is not finite in the model's dtype)."""
        torch = _import_torch()
        p = j.req.prompt
        x = self.lm.embed_ids(torch.as_tensor(p.token_ids, dtype=torch.long))
        if p.is_soft:
            from workbench.model.projector import project

            vec = torch.as_tensor(p.user_vector, dtype=torch.float32, device=self.device)[None]
            with torch.inference_mode():
                row = project(self.projector, vec, dtype=x.dtype)[0]
            validate_projected(row, p.user_vector, self.dtype)
            x = x.clone()
            x[p.placeholder_pos] = row
        return x

    def _decode_segment(self, dec: list[_Job]):
        # the decoding set's prompt KV, padded: kept from step to step, only newcomers copied in (PromptKVBuffer)
        prompt_kv, lens = self._prompt_kv.get([j.serial for j in dec], [j.prompt_kv for j in dec],
                                              [j.prompt_len for j in dec])
        seg, last = decode_segment([j.tokens for j in dec], [j.own_kv for j in dec], prompt_kv, lens, self._kv)
        return seg, self.lm.embed_ids(last)

    def _score_segment(self, sc: list[_Job]):
        torch = _import_torch()
        plens = torch.as_tensor([j.prompt_len for j in sc], device=self.device)
        prompt_kv = pad_prompt_kv([j.prompt_kv for j in sc], plens, self._kv)  # score sets are one-shot
        seg, toks = score_segment([j.req.candidates for j in sc], prompt_kv, plens, self.device)
        return seg, self.lm.embed_ids(toks)

    # ---- beam bookkeeping --------------------------------------------------------------------
    def _mask(self, j: _Job, prefixes):
        """Allowed-token mask [B, vocab] for constrained job `j` at depth prefixes.shape[1]."""
        counts = None
        if j.req.banned_items:
            if j.banned_counts is None:
                j.banned_counts = banned_counts_by_depth(self.trie, j.req.banned_items, self.catalog.depth)
            counts = j.banned_counts[int(prefixes.shape[1])].expand(prefixes.shape[0], -1)
        return constraint_mask(self.trie, prefixes, self.lm.vocab_size, counts)

    def _allowed_logp(self, j: _Job, logp):
        """`logp` [B, vocab] with the tokens that constrained job `j` may not take next at -inf."""
        if not j.req.constrained:
            return logp
        torch = _import_torch()
        prefixes = j.tokens if j.tokens is not None else torch.zeros(logp.shape[0], 0, dtype=torch.long,
                                                                     device=logp.device)
        return logp.masked_fill(~self._mask(j, prefixes), float("-inf"))

    def _select(self, j: _Job, cum, logp) -> None:
        """Keep the top beam_width of (beam, token) continuations; finish when all tokens are out."""
        self._apply(j, select_beams(j.tokens, cum, self._allowed_logp(j, logp), j.req.beam_width), logp)

    def _apply(self, j: _Job, sel, logp) -> None:
        """Take selection `sel` of job `j` (None: nothing finite was left; `logp` says whether NaN is why)."""
        if sel is None:
            j.done = True
            if bool(logp.isnan().any()):  # not the constraint: say so (a NaN row is no "banned SID")
                self._fail(j, "no finite continuation: the model's log-probs for this request are NaN (the input "
                              "drives it beyond what its dtype can hold; check the user vector's scale)")
            else:
                self._fail(j, "no valid continuation: every SID is banned or the constraint allows no token")
            return
        j.tokens, j.cum, j.parents = sel.tokens, sel.cum, sel.parents
        if j.tokens.shape[1] >= j.req.max_new_tokens:
            self._finish_beam(j)

    def _first_step(self, j: _Job) -> None:
        lp = j.first_logprobs[None]  # [1, vocab]
        torch = _import_torch()
        self._select(j, torch.zeros(1, device=lp.device), lp)
        j.own_kv = None

    def _decode_step(self, dec: list[_Job], seg, h) -> None:
        torch = _import_torch()
        lp = self.lm.log_probs(h)  # [rows, vocab]
        offs = row_offsets([int(j.tokens.shape[0]) for j in dec])
        rows = [lp[offs[r] : offs[r + 1]] for r in range(len(dec))]
        groups: dict[tuple, list[int]] = {}  # requests of one beam count and width: one top-k
        for r, j in enumerate(dec):
            groups.setdefault((int(j.tokens.shape[0]), j.req.beam_width), []).append(r)
        for (_, width), members in groups.items():
            js = [dec[r] for r in members]
            allowed = [self._allowed_logp(j, rows[r]) for j, r in zip(js, members)]
            sels = [None] * len(js)
            if len(js) > 1:
                sels = select_beams_stacked([j.tokens for j in js], torch.stack([j.cum for j in js]),
                                            torch.stack(allowed), width)
            for j, r, a, sel in zip(js, members, allowed, sels):
                s_new = int(j.tokens.shape[1])  # own KV length after this step
                self._apply(j, sel if sel is not None else select_beams(j.tokens, j.cum, a, width), rows[r])
                if j.done:
                    j.own_kv = j.prompt_kv = None
                else:
                    j.own_kv = reorder_own_kv(seg.own_kv, r, j.parents, s_new)

    def _finish_beam(self, j: _Job) -> None:
        j.done = True
        j.future.set_result(BeamSearchResult(j.req.request_id, beams=beams_of(j.tokens, j.cum),
                                             timings=j.timings.finish(), prompt_tokens=j.prompt_len))
        j.own_kv = j.prompt_kv = None

    def _finish_scores(self, sc: list[_Job], seg, h) -> None:
        offs = row_offsets([sum(len(c) for c in j.req.candidates) for j in sc])
        for r, j in enumerate(sc):
            req = j.req
            lo, hi = offs[r], offs[r + 1]
            scores = candidate_scores(self.lm.log_probs, h[lo:hi], req.candidates, seg.i_idx[lo:hi], req.mode,
                                      req.label_token_ids, j.first_logprobs)
            j.done = True
            j.future.set_result(ScoreResult(req.request_id, scores=scores, timings=j.timings.finish(),
                                            prompt_tokens=j.prompt_len))
            j.prompt_kv = None
