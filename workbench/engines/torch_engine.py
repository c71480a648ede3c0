"""The workbench's own engine: beam search, multi-item scoring and soft tokens on one fast path.

How it works (see torch_model.py for the attention layouts):

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
  the `<|user|>` placeholder's embedding before the first forward.

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
from typing import Sequence

from workbench.engines.base import (
    Beam,
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
    validate_beam_request,
    validate_score_request,
)
from workbench.engines.checks import validate_constraint


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
# Prompt KV of a decode/score batch is padded to a multiple of this many positions (see _shared_prompt_kv).
PROMPT_KV_BUCKET = 128


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
    cum: object = None  # [B_live] float64
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
    ):
        """`batch_invariant`: fixed-size GEMM row blocks so results are identical whatever shares a
        batch, also with several BLAS threads (opt-in: costs up to ~2x on small decode batches)."""
        torch = _import_torch()
        from workbench.model.checkpoint import LoadedCheckpoint, load_checkpoint
        from workbench.engines.torch_model import FastLM

        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RequestError(f"device {device!r} requested but torch sees no CUDA device; use device='cpu'")
        if num_threads:
            torch.set_num_threads(int(num_threads))
        ck = checkpoint if isinstance(checkpoint, LoadedCheckpoint) else load_checkpoint(checkpoint, dtype=dtype, device=device)
        self.checkpoint = ck
        self.dtype = dtype
        self.device = torch.device(device)
        self.lm = FastLM(ck.model, device=self.device, dtype=getattr(torch, dtype), batch_invariant=batch_invariant)
        self.projector = ck.projector.to(self.device) if ck.projector is not None else None
        self.catalog = ck.catalog
        self.trie = ck.catalog.trie()
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
        )
        self.stats = EngineStats()
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._prompt_cache_key = None
        self._prompt_cache = None

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
        if self.projector is None:
            feats = dict(caps.features)
            why = "this checkpoint has no soft-token projector"
            feats["soft_token"] = FeatureSupport(Support.UNSUPPORTED, why)
            feats["soft_token_beam_search"] = FeatureSupport(Support.UNSUPPORTED, why)
            caps = Capabilities(engine="torch", features=feats)
        return caps

    def prompt_logits(self, prompt):
        """Logits [L, vocab] of the prompt (soft token applied) through the engine's own forward.

        Synchronous and outside the scheduler: for parity checks against an HF forward.
        """
        from workbench.engines.base import BeamSearchRequest
        from workbench.engines.torch_model import PrefillSegment

        req = BeamSearchRequest(prompt, beam_width=1, max_new_tokens=1)
        validate_beam_request(req, self.limits)
        job = _Job("beam", req, Timings.start(), concurrent.futures.Future())
        h = self.lm.forward(self._prompt_embeds(job), [PrefillSegment([job.prompt_len])])
        return self.lm.logits(h)

    def reset_stats(self) -> None:
        self.stats = EngineStats()

    # ---- public async API --------------------------------------------------------------------
    async def beam_search(self, requests: Sequence[BeamSearchRequest]) -> list[BeamSearchResult]:
        futs = [self._submit_beam(r) for r in requests]
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futs)))

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        futs = [self._submit_score(r) for r in requests]
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

    def _submit_beam(self, r: BeamSearchRequest) -> concurrent.futures.Future:
        t = Timings.start()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            if self._closed:
                raise RequestError("engine is closed")
            self.validate_beam(r)
        except RequestError as e:
            fut.set_result(BeamSearchResult(r.request_id, success=False, error=str(e), timings=t.finish(),
                                            prompt_tokens=len(r.prompt.token_ids)))
            return fut
        self._enqueue(_Job("beam", r, t, fut))
        return fut

    def _submit_score(self, r: ScoreRequest) -> concurrent.futures.Future:
        t = Timings.start()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            if self._closed:
                raise RequestError("engine is closed")
            validate_score_request(r, self.limits)
        except RequestError as e:
            fut.set_result(ScoreResult(r.request_id, success=False, error=str(e), timings=t.finish(),
                                       prompt_tokens=len(r.prompt.token_ids)))
            return fut
        self._enqueue(_Job("score", r, t, fut))
        return fut

    def _enqueue(self, job: _Job) -> None:
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
        from workbench.engines.torch_model import PrefillSegment

        lm = self.lm
        xs, segments = [], []
        if pre:
            xs.append(torch.cat([self._prompt_embeds(j) for j in pre]))
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
        off = 0
        if pre:
            seg = segments[0]
            n = seg.n_rows
            last = torch.cumsum(torch.as_tensor(seg.lengths, device=h.device), 0) - 1
            lp = lm.log_probs(h[last])  # [n_prompts, vocab]
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

    def _prompt_embeds(self, j: _Job):
        torch = _import_torch()
        p = j.req.prompt
        x = self.lm.embed_ids(torch.as_tensor(p.token_ids, dtype=torch.long))
        if p.is_soft:
            from workbench.model.projector import project

            vec = torch.as_tensor(p.user_vector, dtype=torch.float32, device=self.device)[None]
            with torch.inference_mode():
                row = project(self.projector, vec, dtype=x.dtype)[0]
            x = x.clone()
            x[p.placeholder_pos] = row
        return x

    def _shared_prompt_kv(self, jobs: list[_Job], cache: bool = True):
        """Prompt KV of `jobs` padded into [R, Hkv, Pmax, D] per layer; cached while the set is unchanged."""
        torch = _import_torch()
        key = tuple(j.serial for j in jobs)
        if cache and key == self._prompt_cache_key:
            return self._prompt_cache
        lm = self.lm
        lens = torch.as_tensor([j.prompt_len for j in jobs], device=self.device)
        # Pad to a fixed bucket, not to the batch's longest prompt: the softmax and p@V reductions then
        # run over the same length alone or in any batch, so results do not depend on batch mates.
        pmax = -(-int(lens.max()) // PROMPT_KV_BUCKET) * PROMPT_KV_BUCKET
        out = []
        for li in range(len(lm.layers)):
            kP = torch.zeros(len(jobs), lm.n_kv, pmax, lm.head_dim, dtype=lm.dtype, device=self.device)
            vP = torch.zeros_like(kP)
            for r, j in enumerate(jobs):
                k, v = j.prompt_kv[li]
                kP[r, :, : k.shape[1]] = k
                vP[r, :, : v.shape[1]] = v
            out.append((kP, vP))
        if cache:
            self._prompt_cache_key, self._prompt_cache = key, (out, lens)
        return out, lens

    def _decode_segment(self, dec: list[_Job]):
        torch = _import_torch()
        from workbench.engines.torch_model import MIN_ROWS, SharedSegment

        lm, dev = self.lm, self.device
        prompt_kv, plens = self._shared_prompt_kv(dec)
        R = len(dec)
        # at least MIN_ROWS streams: the attention matmuls then take the same BLAS path alone or batched
        S = max(MIN_ROWS, max(int(j.tokens.shape[0]) for j in dec))
        past = [int(j.tokens.shape[1]) - 1 for j in dec]
        tp = max(past)
        r_idx = torch.cat([torch.full((int(j.tokens.shape[0]),), r, dtype=torch.long) for r, j in enumerate(dec)])
        s_idx = torch.cat([torch.arange(int(j.tokens.shape[0])) for j in dec])
        past_kv = None
        if tp:
            past_kv = []
            for li in range(len(lm.layers)):
                k = torch.zeros(R, S, lm.n_kv, tp, lm.head_dim, dtype=lm.dtype, device=dev)
                v = torch.zeros_like(k)
                for r, j in enumerate(dec):
                    if past[r]:
                        jk, jv = j.own_kv[li]
                        k[r, : jk.shape[0], :, : past[r]] = jk
                        v[r, : jv.shape[0], :, : past[r]] = jv
                past_kv.append((k, v))
        seg = SharedSegment(
            R=R, S=S, Lq=1, r_idx=r_idx.to(dev), s_idx=s_idx.to(dev), i_idx=torch.zeros_like(r_idx).to(dev),
            prompt_kv=prompt_kv, prompt_len=plens, past_kv=past_kv,
            past_len=torch.as_tensor(past, device=dev),
        )
        last = torch.cat([j.tokens[:, -1] for j in dec]).to(dev)
        return seg, lm.embed_ids(last)

    def _score_segment(self, sc: list[_Job]):
        torch = _import_torch()
        from workbench.engines.torch_model import MIN_ROWS, SharedSegment

        dev = self.device
        prompt_kv, plens = self._shared_prompt_kv(sc, cache=False)  # score sets are one-shot
        S = max(MIN_ROWS, max(len(j.req.candidates) for j in sc))
        lq = max(len(c) for j in sc for c in j.req.candidates)
        r_idx, s_idx, i_idx, toks = [], [], [], []
        for r, j in enumerate(sc):
            for s, c in enumerate(j.req.candidates):
                n = len(c)
                r_idx += [r] * n
                s_idx += [s] * n
                i_idx += range(n)
                toks += c
        as_t = lambda z: torch.as_tensor(z, dtype=torch.long, device=dev)  # noqa: E731
        seg = SharedSegment(
            R=len(sc), S=S, Lq=lq, r_idx=as_t(r_idx), s_idx=as_t(s_idx), i_idx=as_t(i_idx),
            prompt_kv=prompt_kv, prompt_len=plens, past_kv=None, past_len=torch.zeros(len(sc), dtype=torch.long, device=dev),
        )
        return seg, self.lm.embed_ids(as_t(toks))

    # ---- beam bookkeeping --------------------------------------------------------------------
    def _mask(self, j: _Job, prefixes):
        """Allowed-token mask [B, vocab] for constrained job `j` at depth prefixes.shape[1]."""
        torch = _import_torch()
        req = j.req
        t = int(prefixes.shape[1])
        counts = None
        if req.banned_items:
            if j.banned_counts is None:
                j.banned_counts = [self.trie.banned_counts([list(req.banned_items)], d) for d in range(self.catalog.depth)]
            counts = j.banned_counts[t].expand(prefixes.shape[0], -1)
        m = self.trie.allowed_mask(prefixes.cpu(), banned_counts=counts)
        if m.shape[1] < self.lm.vocab_size:  # model vocab padded beyond the layout's tokens
            m = torch.nn.functional.pad(m, (0, self.lm.vocab_size - m.shape[1]))
        return m.to(self.device)

    def _select(self, j: _Job, cum, logp) -> None:
        """Keep the top beam_width of (beam, token) continuations; finish when all tokens are out."""
        torch = _import_torch()
        req = j.req
        if req.constrained:
            prefixes = j.tokens if j.tokens is not None else torch.zeros(cum.shape[0], 0, dtype=torch.long)
            logp = logp.masked_fill(~self._mask(j, prefixes), float("-inf"))
        cand = (cum[:, None] + logp).flatten()  # [B * vocab]
        k = min(req.beam_width, cand.numel())
        top, idx = torch.topk(cand, k)
        keep = torch.isfinite(top)
        top, idx = top[keep], idx[keep]
        vocab = logp.shape[1]
        parents, toks = idx // vocab, idx % vocab
        if top.numel() == 0:
            j.done = True
            self._fail(j, "no valid continuation: every SID is banned or the constraint allows no token")
            return
        prev = j.tokens if j.tokens is not None else torch.zeros(1, 0, dtype=torch.long, device=toks.device)
        j.tokens = torch.cat([prev.to(toks.device)[parents], toks[:, None]], dim=1)
        j.cum = top
        j.parents = parents
        if j.tokens.shape[1] >= req.max_new_tokens:
            self._finish_beam(j)

    def _first_step(self, j: _Job) -> None:
        lp = j.first_logprobs[None]  # [1, vocab]
        torch = _import_torch()
        self._select(j, torch.zeros(1, device=lp.device), lp)
        j.own_kv = None

    def _decode_step(self, dec: list[_Job], seg, h) -> None:
        lp = self.lm.log_probs(h)  # [rows, vocab]
        off = 0
        for r, j in enumerate(dec):
            b = int(j.tokens.shape[0])
            s_new = int(j.tokens.shape[1])  # own KV length after this step
            self._select(j, j.cum, lp[off : off + b])
            off += b
            if j.done:
                j.own_kv = None
                j.prompt_kv = None
                continue
            parents = j.parents
            j.own_kv = [(k[r, parents, :, :s_new], v[r, parents, :, :s_new]) for k, v in seg.own_kv]

    def _finish_beam(self, j: _Job) -> None:
        j.done = True
        beams = [Beam(token_ids=t, cum_logprob=float(c)) for t, c in zip(j.tokens.tolist(), j.cum.tolist())]
        j.future.set_result(BeamSearchResult(j.req.request_id, beams=beams, timings=j.timings.finish(),
                                             prompt_tokens=j.prompt_len))
        j.own_kv = j.prompt_kv = None

    def _finish_scores(self, sc: list[_Job], seg, h) -> None:
        torch = _import_torch()
        lm = self.lm
        i_idx = seg.i_idx
        off_by_job = torch.zeros(len(sc) + 1, dtype=torch.long)
        for r, j in enumerate(sc):
            off_by_job[r + 1] = off_by_job[r] + sum(len(c) for c in j.req.candidates)
        for r, j in enumerate(sc):
            req = j.req
            lo, hi = int(off_by_job[r]), int(off_by_job[r + 1])
            lens = torch.as_tensor([len(c) for c in req.candidates])
            ends = torch.cumsum(lens, 0) - 1  # local row of each candidate's last token
            if req.mode == "label":
                lp = lm.log_probs(h[lo:hi][ends.to(h.device)])  # [C, vocab]
                labels = torch.as_tensor(req.label_token_ids, device=lp.device)
                scores = lp[:, labels].tolist()
            else:
                toks = torch.as_tensor([t for c in req.candidates for t in c], device=h.device)
                local_i = i_idx[lo:hi]
                not_last = torch.ones(hi - lo, dtype=torch.bool, device=h.device)
                not_last[ends.to(h.device)] = False
                lp_rows = lm.log_probs(h[lo:hi][not_last])  # rows predicting the next candidate token
                nxt = toks[1:][not_last[:-1]]
                per_tok = torch.zeros(hi - lo, dtype=torch.float64, device=h.device)
                per_tok[torch.nonzero(~(local_i == 0)).squeeze(1)] = torch.gather(lp_rows, 1, nxt[:, None]).squeeze(1)
                first = torch.as_tensor([c[0] for c in req.candidates], device=h.device)
                per_tok[(local_i == 0).nonzero().squeeze(1)] = j.first_logprobs[first]
                cand_of_row = torch.repeat_interleave(torch.arange(len(lens), device=h.device), lens.to(h.device))
                scores = torch.zeros(len(lens), dtype=per_tok.dtype, device=h.device).index_add_(0, cand_of_row, per_tok).tolist()
            j.done = True
            j.future.set_result(ScoreResult(req.request_id, scores=scores, timings=j.timings.finish(),
                                            prompt_tokens=j.prompt_len))
            j.prompt_kv = None
