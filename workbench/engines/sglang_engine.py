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
  `items` (token-id lists allowed), `label_token_ids`, `apply_softmax`, `item_first`, `model`, and
  the score-time embedding overrides `embed_override_token_id: Optional[int]`,
  `query_embed_overrides: Optional[List[List[float]]]` ([num_overrides][hidden_size]),
  `item_embed_overrides: Optional[List[Optional[List[List[float]]]]]`; `ScoringResponse.scores`:
  per item, the probabilities of the label tokens in order). Checked in the sglang 0.5.23 wheel
  itself (`pip download sglang==0.5.23 --no-deps`, `sglang/_version.py` = 0.5.23):
  `serving_score.py` turns the override lists into float32 tensors and
  `tokenizer_manager_score_mixin.py` (`_build_token_id_inputs`) places each query override at the
  positions of `embed_override_token_id` in the query (count must match), also inside the packed
  multi-item sequence. The overrides came with sgl-project/sglang PR #20960 ("token embedding
  overrides for sparse embedding replacement"). `/generate` has no HTTP-usable equivalent in 0.5.23
  (`GenerateReqInput.positional_embed_overrides` is typed `Any` and holds torch tensors).
- multi-item scoring in 0.5.23 is the server flag `--enable-mis` (with `--attention-backend
  flashinfer`; `sglang/srt/arg_groups/fields/exec_.py`); the PR #10979 flag
  `--multi-item-scoring-delimiter` no longer exists. The packed sequence is `query <9999> item_1
  <9999> ... item_N <9999>` with the fixed placeholder `MIS_DELIMITER_TOKEN_ID = 9999`
  (`sglang/srt/constants.py`): the model's vocabulary must be larger than 9999 (the placeholder is
  embedded), and each item attends to the query and to the placeholder before it (FlashInfer
  item-aware mask, `layers/attention/flashinfer_backend.py` `_process_multi_item_scoring`), so MIS
  scores condition on one extra token compared with the torch oracle's `prompt + item`; the GPU
  parity run measures that difference. The adapter enables MIS only when the vocabulary allows it.

Feature map:
- beam search: SGLang 0.5.23 has no beam search (the beam-search PR sgl-project/sglang#15645 was
  not merged; issue #23356), so every beam search is the client-side loop of one-token `/generate`
  requests (`top_logprobs_num` = beam width, or `token_ids_logprob` = allowed trie children),
  reported as emulated.
- soft token, generation: `input_embeds` ([T, hidden] list of floats) built client-side, like
  vLLM's `prompt_embeds`.
- scoring, label mode: `/v1/score` with token-id items and `apply_softmax=false` (log of the
  returned full-vocabulary probabilities) - native multi-item scoring when the server runs with
  `--enable-mis`, else one sequence per item inside SGLang. With a soft token the same call carries
  `embed_override_token_id` = the `<|user|>` id and `query_embed_overrides` = [projector(user
  vector)] (projected client-side; the rest of the prompt stays token ids).
- scoring, sequence mode: `/generate` per candidate (`input_ids` = prompt + candidate,
  `return_logprob`, `logprob_start_len` = prompt length, `max_new_tokens=1`), summing the
  candidate's `input_token_logprobs` (fan-out, prefix reused by the radix cache). Unsupported with a
  soft token (no input log-probs are computed for `input_embeds` prompts, and `/v1/score` reads
  only label tokens).
"""

from __future__ import annotations

import asyncio
import math
from typing import Sequence

from workbench.engines.base import (
    FEATURES,
    BeamSearchRequest,
    Capabilities,
    FeatureSupport,
    RequestError,
    ScoreRequest,
    Support,
)
from workbench.engines.http_common import HTTPEngineBase

SGLANG_VERSION = "0.5.23"
MIS_DELIMITER_TOKEN_ID = 9999  # sglang/srt/constants.py in 0.5.23: embedded, so vocab must exceed it


class SGLangEngine(HTTPEngineBase):
    """The `Engine` protocol over an SGLang server (launched from its environment or given by `url`)."""

    name = "sglang"
    server_key = "sglang"
    missing_hint = f"SGLang {SGLANG_VERSION} is not installed here"
    server_label = "sglang server"
    served_model_name = "workbench"

    def __init__(self, checkpoint, dtype: str = "float32", url: str | None = None, *, request_timeout_s: float = 300.0,
                 max_concurrency: int = 64, multi_item_scoring: bool = True, server_options: dict | None = None,
                 log_path=None, **limit_kw):
        self._init_common(checkpoint, dtype, url, request_timeout_s, max_concurrency, limit_kw)
        self.multi_item_scoring = multi_item_scoring
        opts = dict(server_options or {})
        if url is None and multi_item_scoring:
            if self.info.vocab_size > MIS_DELIMITER_TOKEN_ID:
                opts.setdefault("enable_mis", True)
            else:
                self.multi_item_scoring = False  # the 9999 placeholder would index past the embedding table
        self._launch_or_connect(url, opts, log_path)

    @staticmethod
    def static_capabilities() -> Capabilities:
        f = {
            "beam_search_all_beams": FeatureSupport(
                Support.EMULATED, f"SGLang {SGLANG_VERSION} has no beam search (PR #15645 unmerged): client-side beam "
                "loop of one-token /generate requests with top_logprobs_num"),
            "trie_constraint": FeatureSupport(
                Support.EMULATED, "client-side beam loop with token_ids_logprob = allowed trie children"),
            "soft_token": FeatureSupport(
                Support.NATIVE, "generation: input_embeds built client-side (embedding table + projector); label "
                "scoring: /v1/score embed_override_token_id=<|user|> + query_embed_overrides=[projected vector] "
                "(with the other items under --enable-mis); sequence scoring unsupported (no input log-probs for "
                "input_embeds, /v1/score reads label tokens only)"),
            "soft_token_beam_search": FeatureSupport(
                Support.EMULATED, "client-side beam loop of one-token input_embeds requests"),
            "multi_item_scoring": FeatureSupport(
                Support.NATIVE, "/v1/score with --enable-mis (label mode, FlashInfer, CUDA; needs vocab > 9999 for "
                "the fixed delimiter placeholder, which items also attend to)"),
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

    async def _beams(self, r: BeamSearchRequest) -> list:
        return await self._beam_emulated(r)

    async def _scores(self, r: ScoreRequest) -> list:
        if r.mode == "label":
            return await self._score_label_mis(r)
        if r.prompt.is_soft:
            raise RequestError("sequence-mode scoring with a soft token is unsupported on SGLang "
                               f"{SGLANG_VERSION}: no input log-probs for input_embeds prompts; use mode 'label'")
        return await self._score_sequence(r)

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
        if r.prompt.is_soft:
            body["embed_override_token_id"] = int(self.limits.placeholder_id)
            body["query_embed_overrides"] = [self._projected_user_row(r.prompt)]
        out = await self._post("/v1/score", body)
        scores = out["scores"]
        if len(scores) != len(r.candidates):
            raise RuntimeError(f"/v1/score returned {len(scores)} rows for {len(r.candidates)} items")
        return [[math.log(p) if p > 0 else float("-inf") for p in row] for row in scores]

    def _projected_user_row(self, prompt) -> list[float]:
        """projector(user_vector) as a [hidden] list: the embedding SGLang writes at the <|user|> position."""
        import time

        t0 = time.perf_counter()
        row = self.embedder.embed([self.limits.placeholder_id], prompt.user_vector, 0)[0].tolist()
        self.transport.add(time.perf_counter() - t0, len(row) * 8)
        return row

    async def _score_label_fanout(self, r: ScoreRequest) -> list[list[float]]:
        """One-token /generate per candidate with input_embeds (kept for servers without embed overrides)."""
        p = list(r.prompt.token_ids)

        async def one(c):
            body = {**self._input_fields(p + list(c), r.prompt),
                    "sampling_params": {"max_new_tokens": 1, "temperature": 1.0, "ignore_eos": True},
                    "return_logprob": True, "logprob_start_len": -1, "token_ids_logprob": list(r.label_token_ids)}
            out = await self._post("/generate", body, with_model=False)
            got = self._triples(out["meta_info"]["output_token_ids_logprobs"][0])
            return [got[t] for t in r.label_token_ids]

        return list(await asyncio.gather(*(one(c) for c in r.candidates)))
