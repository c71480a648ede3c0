"""SGLang behind the workbench contract, over its HTTP server (`python -m sglang.launch_server`).

Pinned: `sglang==0.5.23` (environments/sglang.yml; CUDA only - it cannot run on the CPU machines
where this was written, so everything here is written against the documented API and checked only
by the contract test against a stand-in server: "written, not run here"). Sources read:

- `/generate` request: `python/sglang/srt/managers/io_struct.py` (`GenerateReqInput`: `input_ids`,
  `input_embeds`, `sampling_params`, `return_logprob`, `logprob_start_len`, `top_logprobs_num`,
  `token_ids_logprob`); response `meta_info` with `input_token_logprobs`, `output_top_logprobs`,
  `output_token_ids_logprobs` as `[logprob, token_id, text|null]` triples
  (`python/sglang/srt/managers/tokenizer_manager.py`, `convert_logprob_style`).
- `/v1/score`: `python/sglang/srt/entrypoints/openai/protocol.py` (`ScoringRequest`: `query`,
  `items` (token-id lists allowed), `label_token_ids`, `apply_softmax`, `item_first`, `model`;
  `ScoringResponse.scores`: per item, the probabilities of the label tokens in order). Multi-item
  scoring (all items in one sequence with a per-item attention mask, FlashInfer) is turned on by the
  server flag `--multi-item-scoring-delimiter <token id>` (sgl-project/sglang PR #10979); without it
  the server scores the items one by one.

Feature map:
- beam search: SGLang 0.5.23 has no beam search (the beam-search PR sgl-project/sglang#15645 was
  not merged; issue #23356), so every beam search is the client-side loop of one-token `/generate`
  requests (`top_logprobs_num` = beam width, or `token_ids_logprob` = allowed trie children),
  reported as emulated.
- soft token: `input_embeds` ([T, hidden] list of floats) built client-side, like vLLM's
  `prompt_embeds`; `positional_embed_overrides` (an embedding at one position, newer versions) is not
  used because the pinned version's HTTP schema types it as `Any` holding torch tensors.
- scoring, label mode: `/v1/score` with token-id items and `apply_softmax=false` (log of the
  returned full-vocabulary probabilities) - native multi-item scoring when the server was launched
  with the delimiter, else fan-out inside SGLang. With a soft token: one-token `/generate` per
  candidate with `input_embeds` and `token_ids_logprob` (fan-out).
- scoring, sequence mode: `/generate` per candidate (`input_ids` = prompt + candidate,
  `return_logprob`, `logprob_start_len` = prompt length, `max_new_tokens=1`), summing the
  candidate's `input_token_logprobs` (fan-out, prefix reused by the radix cache). Unsupported with a
  soft token (no input log-probs are computed for `input_embeds` prompts in the pinned version).
"""

from __future__ import annotations

import asyncio
import math
from typing import Sequence

from workbench.engines.base import (
    FEATURES,
    BeamSearchRequest,
    BeamSearchResult,
    Capabilities,
    FeatureSupport,
    RequestError,
    ScoreRequest,
    ScoreResult,
    Support,
    Timings,
    validate_score_request,
)
from workbench.engines.http_common import HTTPEngineBase

SGLANG_VERSION = "0.5.23"


class SGLangEngine(HTTPEngineBase):
    """The `Engine` protocol over an SGLang server (launched from its environment or given by `url`)."""

    name = "sglang"

    def __init__(self, checkpoint, dtype: str = "float32", url: str | None = None, *, request_timeout_s: float = 300.0,
                 max_concurrency: int = 64, multi_item_scoring: bool = True, server_options: dict | None = None,
                 log_path=None, **limit_kw):
        self._init_common(checkpoint, dtype, url, request_timeout_s, max_concurrency, limit_kw)
        self.multi_item_scoring = multi_item_scoring
        if url is None:
            from workbench.engines import launcher

            opts = dict(server_options or {})
            if multi_item_scoring:
                opts.setdefault("delimiter_token_id", self.info.meta.layout.special_id("<|sep|>"))
            self._launch(launcher.sglang_spec(self.checkpoint, dtype, **opts), log_path)
            self.model_name = "workbench"

    @classmethod
    def check_available(cls) -> tuple[bool, str]:
        from workbench.engines import launcher

        exe = launcher.find_executable("sglang")
        if exe is None:
            return False, f"SGLang {SGLANG_VERSION} is not installed here; {launcher.HOW_TO_BUILD['sglang']}"
        return True, f"sglang server from {exe}"

    @staticmethod
    def static_capabilities() -> Capabilities:
        f = {
            "beam_search_all_beams": FeatureSupport(
                Support.EMULATED, f"SGLang {SGLANG_VERSION} has no beam search (PR #15645 unmerged): client-side beam "
                "loop of one-token /generate requests with top_logprobs_num"),
            "trie_constraint": FeatureSupport(
                Support.EMULATED, "client-side beam loop with token_ids_logprob = allowed trie children"),
            "soft_token": FeatureSupport(
                Support.NATIVE, "input_embeds built client-side (embedding table + projector); label scoring works, "
                "sequence scoring does not (no input log-probs for input_embeds)"),
            "soft_token_beam_search": FeatureSupport(
                Support.EMULATED, "client-side beam loop of one-token input_embeds requests"),
            "multi_item_scoring": FeatureSupport(
                Support.NATIVE, "/v1/score with --multi-item-scoring-delimiter (label mode, FlashInfer, CUDA)"),
            "fanout_scoring": FeatureSupport(
                Support.NATIVE, "/generate per candidate with input_token_logprobs (sequence mode)"),
        }
        assert set(f) == set(FEATURES)
        return Capabilities("sglang", f)

    def capabilities(self) -> Capabilities:
        return self.static_capabilities()

    # ---- /generate helpers ------------------------------------------------------------------------

    def _input_fields(self, token_ids: Sequence[int], r_prompt) -> dict:
        if not r_prompt.is_soft:
            return {"input_ids": list(token_ids)}
        import time

        t0 = time.perf_counter()
        emb = self.embedder.embed(token_ids, r_prompt.user_vector, r_prompt.placeholder_pos)
        rows = emb.tolist()
        self.transport.add(time.perf_counter() - t0, len(rows) * len(rows[0]) * 8)
        return {"input_embeds": rows}

    @staticmethod
    def _triples(entries) -> dict[int, float]:
        return {int(t[1]): float(t[0]) for t in (entries or []) if t is not None}

    async def _next_logprobs(self, r: BeamSearchRequest, prefix: list[int], allowed: list[int] | None,
                             k: int) -> dict[int, float]:
        body = {**self._input_fields(list(r.prompt.token_ids) + prefix, r.prompt),
                "sampling_params": {"max_new_tokens": 1, "temperature": 1.0, "ignore_eos": True},
                "return_logprob": True, "logprob_start_len": -1}
        if allowed is None:
            body["top_logprobs_num"] = k
        else:
            body["token_ids_logprob"] = allowed
        out = await self._post("/generate", body, with_model=False)
        meta = out["meta_info"]
        if allowed is None:
            return self._triples(meta["output_top_logprobs"][0])
        ok = set(allowed)
        return {t: v for t, v in self._triples(meta["output_token_ids_logprobs"][0]).items() if t in ok}

    # ---- contract -------------------------------------------------------------------------------

    async def beam_search(self, requests: Sequence[BeamSearchRequest]) -> list[BeamSearchResult]:
        return list(await asyncio.gather(*(self._beam_one(r) for r in requests)))

    async def _beam_one(self, r: BeamSearchRequest) -> BeamSearchResult:
        res = BeamSearchResult(request_id=r.request_id, timings=Timings.start(), prompt_tokens=len(r.prompt))
        try:
            self.validate_beam(r)
            res.beams = await self._beam_emulated(r)
        except Exception as e:  # noqa: BLE001
            res.success, res.error = False, f"{type(e).__name__}: {e}"
        res.timings.finish()
        return res

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        return list(await asyncio.gather(*(self._score_one(r) for r in requests)))

    async def _score_one(self, r: ScoreRequest) -> ScoreResult:
        res = ScoreResult(request_id=r.request_id, timings=Timings.start(), prompt_tokens=len(r.prompt))
        try:
            validate_score_request(r, self.limits)
            if r.mode == "sequence":
                if r.prompt.is_soft:
                    raise RequestError("sequence-mode scoring with a soft token is unsupported on SGLang "
                                       f"{SGLANG_VERSION}: no input log-probs for input_embeds prompts; use mode 'label'")
                res.scores = await self._score_sequence(r)
            elif r.prompt.is_soft:
                res.scores = await self._score_label_fanout(r)
            else:
                res.scores = await self._score_label_mis(r)
        except Exception as e:  # noqa: BLE001
            res.success, res.error = False, f"{type(e).__name__}: {e}"
        res.timings.finish()
        return res

    async def _score_sequence(self, r: ScoreRequest) -> list[float]:
        p = list(r.prompt.token_ids)

        async def one(c):
            body = {"input_ids": p + list(c), "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
                    "return_logprob": True, "logprob_start_len": len(p)}
            out = await self._post("/generate", body, with_model=False)
            entries = out["meta_info"]["input_token_logprobs"]
            # entries cover positions logprob_start_len.. of the input; keep the candidate's tokens
            vals = [float(e[0]) for e in entries if e is not None and e[0] is not None]
            if len(vals) < len(c):
                raise RuntimeError(f"SGLang returned {len(vals)} input log-probs for a {len(c)}-token candidate")
            return sum(vals[-len(c):])

        return list(await asyncio.gather(*(one(c) for c in r.candidates)))

    async def _score_label_mis(self, r: ScoreRequest) -> list[list[float]]:
        body = {"query": list(r.prompt.token_ids), "items": [list(c) for c in r.candidates],
                "label_token_ids": list(r.label_token_ids), "apply_softmax": False, "item_first": False}
        out = await self._post("/v1/score", body)
        scores = out["scores"]
        if len(scores) != len(r.candidates):
            raise RuntimeError(f"/v1/score returned {len(scores)} rows for {len(r.candidates)} items")
        return [[math.log(p) if p > 0 else float("-inf") for p in row] for row in scores]

    async def _score_label_fanout(self, r: ScoreRequest) -> list[list[float]]:
        p = list(r.prompt.token_ids)

        async def one(c):
            body = {**self._input_fields(p + list(c), r.prompt),
                    "sampling_params": {"max_new_tokens": 1, "temperature": 1.0, "ignore_eos": True},
                    "return_logprob": True, "logprob_start_len": -1, "token_ids_logprob": list(r.label_token_ids)}
            out = await self._post("/generate", body, with_model=False)
            got = self._triples(out["meta_info"]["output_token_ids_logprobs"][0])
            return [got[t] for t in r.label_token_ids]

        return list(await asyncio.gather(*(one(c) for c in r.candidates)))
