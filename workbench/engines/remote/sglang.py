"""SGLang behind the workbench contract, over its HTTP server (`python -m sglang.launch_server`).

Pinned: `sglang==0.5.23` (environments/; CUDA only - it cannot run on the CPU machines where this was
written: "written, not run here"). Every request body and every field read below was checked against the
sglang 0.5.23 wheel itself (`make sglang-wheel`: `pip download sglang==0.5.23 --no-deps`), and
tests/test_sglang_wheel_contract.py validates what this adapter sends with SGLang's own request models
loaded from that wheel. Paths are inside the wheel.

- `/generate` request: `sglang/srt/managers/io_struct.py` (`GenerateReqInput`: `input_ids`, `input_embeds`,
  `sampling_params`, `return_logprob`, `logprob_start_len`, `top_logprobs_num`, `token_ids_logprob`). FastAPI
  parses the body into that dataclass and silently drops unknown keys; the contract gate
  `sglang/srt/entrypoints/api_contract.py` (`sglang/api/v1/api_types.py` `GenerateRequest`) refuses unknown
  `sampling_params` keys. Response `meta_info` log-probs are `[logprob, token_id, text|null]` triples.
- `input_embeds` are refused unless the server runs with `--disable-radix-cache`
  (`managers/tokenizer_manager.py`, `_tokenize_one_request`); the launcher passes it for soft-token
  checkpoints (launcher.sglang_spec). The model runner casts them to bfloat16 whatever the server's dtype
  (`model_executor/model_runner.py`, `_extend_forward_kwargs`: `forward_batch.input_embeds.bfloat16()`), and
  the scheduler replaces the prompt's ids by fake ones (`managers/scheduler.py`: `[1] * len(input_embeds)`).
- Native beam search (`sglang/srt/beam_search/`): `sampling_params` `beam_width` > 1 makes a beam request
  (`sampling/sampling_params.py`; `n` <= `beam_width` = how many sequences come back). The answer carries
  `meta_info.beam_results[i]` = {`output_ids` (generated tokens only), `text`, `meta_info`: {`finish_reason`,
  `sequence_score`}}, best first (`beam_search/output.py`, `_build_beam_search_out_dict` and
  `build_beam_search_out`). `sequence_score` is `BeamGroup.beam_score` = cum_logprob / num_tokens **
  length_penalty (`beam_search/beam_group.py`), and the coordinator builds the group without a length penalty,
  so 1.0 (`beam_search/coordinator.py`); the cumulative log-prob itself is not in the answer. Selection reads
  the raw log-softmax of the logits (`coordinator.py`, `_rows_topk_logprobs`; the leader's sampling params
  are neutralised, `fork.py`). `BeamCoordinator.validate_and_init` refuses (HTTP 400) `return_logprob`,
  constrained decoding (json_schema/regex/ebnf/structural_tag), stop strings, `min_new_tokens`, page size > 1,
  speculative decoding, LoRA, sessions, hierarchical cache and a few parallel modes; it does not refuse
  `input_embeds`.
- `/v1/score`: `sglang/srt/entrypoints/openai/protocol.py` (`ScoringRequest`: `query`, `items` (token-id lists
  allowed), `label_token_ids`, `apply_softmax`, `item_first`, `return_token_logprobs`, `model`, and the
  score-time embedding overrides `embed_override_token_id`, `query_embed_overrides` ([n][hidden]);
  `ScoringResponse`: `scores` (probabilities) and, with `return_token_logprobs`, `token_logprobs`: per item the
  label tokens' full-vocabulary log-probs in request order (`managers/tokenizer_manager_score_mixin.py`,
  `ScoreResult.token_logprobs`), the exact values the probabilities are `exp` of). `serving_score.py` turns the
  override lists into float32 tensors; `_build_token_id_inputs` places each query override at the positions
  of `embed_override_token_id` (count must match), also inside the packed multi-item sequence, and the model
  runner casts it to the model's dtype (`replace_embeds.to(...)`), not to bfloat16. Duplicate label ids and
  ids >= the tokenizer's `vocab_size` are refused (`score_request`).
- Multi-item scoring is the server flag `--enable-mis` (`sglang/srt/arg_groups/fields/exec_.py`), which
  requires `--attention-backend flashinfer` (`arg_groups/attention_hook.py`). FlashInfer has no float32
  attention (0.7.2, pinned by the wheel's METADATA: `flashinfer/jit/utils.py` maps only float16/bfloat16
  query dtypes), so MIS needs a bfloat16/float16 server. The packed sequence is `query <9999> item_1 <9999>
  ... item_N <9999>` with the fixed placeholder `MIS_DELIMITER_TOKEN_ID = 9999` (`sglang/srt/constants.py`):
  the vocabulary must be larger than 9999 (the placeholder is embedded), and each item attends to the query
  and to the placeholder before it (`layers/attention/flashinfer_backend.py`), so MIS scores condition on one
  extra token compared with the torch oracle's `prompt + item`; parity (engines/parity.py) therefore scores
  the oracle on `prompt + <9999> + item` (`label_candidate_prefix`), like with like.

Feature map:
- beam search (every beam): native - one `/generate` with `beam_width` = `n` = the request's width,
  `ignore_eos` (every beam is length-terminated, so `len(output_ids)` is the length the score was divided
  by); each beam's cumulative log-prob is `sequence_score * len(output_ids)`, rounded to float32 (the
  server's cumulative log-prob is a float32 divided in float64: this recovers it bit-exactly). Width 1
  (SGLang's beam_width 1 means plain sampling) and servers that refuse beam requests (the refusal is kept
  and reported by `capabilities()`) use the client-side loop below.
- trie constraint: emulated - SGLang's beam search takes no per-request mask (constrained decoding is
  refused, and selection reads raw log-probs), so the client-side loop of one-token `/generate` requests
  with `token_ids_logprob` = the allowed trie children runs it.
- soft token, generation: `input_embeds` ([T, hidden] floats) built client-side (embedding table +
  projector), with native beam search; constrained soft-token search uses the client-side loop.
- scoring, label mode: `/v1/score` with token-id items, `apply_softmax=false`, `return_token_logprobs=true`:
  the label log-probs are read from `token_logprobs` as SGLang computed them (not recomputed as the log of
  the returned probabilities). Native multi-item scoring when the server runs with `--enable-mis`, else one
  sequence per item inside SGLang. With a soft token the same call carries `embed_override_token_id` = the
  `<|user|>` id and `query_embed_overrides` = [projector(user vector)] (projected client-side).
- scoring, sequence mode: `/generate` per candidate (`input_ids` = prompt + candidate, `return_logprob`,
  `logprob_start_len` = prompt length, `max_new_tokens=0` as SGLang's own scorer sends), summing the
  candidate's `input_token_logprobs` (fan-out, prefix reused by the radix cache). Unsupported with a soft
  token: an `input_embeds` prompt's ids are the scheduler's fake ones, so its input log-probs mean nothing,
  and `/v1/score` reads only label tokens.

Precision and parity tolerances per dtype (workbench/engines/numerics.py derives the bound per dtype):
- bfloat16 (the GPU validation's dtype): everything, MIS included, within the bfloat16 bound; the bfloat16
  cast of `input_embeds` rounds exactly as the torch engine's bfloat16 embedding table and projector output.
- float16: MIS available; plain prompts and label scoring with a soft token (override cast to float16) within
  the float16 bound; soft-token generation sees bfloat16-rounded input embeddings (unit roundoff 2^-8, not
  2^-11), so compare it at the bfloat16 bound.
- float32: no MIS (FlashInfer); plain prompts and soft-token label scoring within the float32 bound;
  soft-token generation gets bfloat16-rounded input embeddings inside a float32 model: compare at the
  bfloat16 bound (whether every float32 layer accepts a bfloat16 first hidden state is not checked here;
  the GPU parity run is that check).
"""

from __future__ import annotations

import asyncio
import struct
import warnings
from typing import Sequence

from workbench.engines.base import (
    FEATURES,
    Beam,
    BeamSearchRequest,
    Capabilities,
    FeatureSupport,
    RequestError,
    ScoreRequest,
    Support,
)
from workbench.engines.remote.http_common import HTTPEngineBase

SGLANG_VERSION = "0.5.23"
MIS_DELIMITER_TOKEN_ID = 9999  # sglang/srt/constants.py in 0.5.23: embedded, so vocab must exceed it
FP32_DTYPES = ("float32", "float")  # --dtype choices that mean float32 (arg_groups/fields/model.py)
NO_FP32_ATTENTION = ("FlashInfer, the only backend --enable-mis accepts (arg_groups/attention_hook.py), has no "
                     "float32 attention (flashinfer 0.7.2 flashinfer/jit/utils.py: float16/bfloat16 only)")
INPUT_EMBEDS_BF16 = ("SGLang casts input_embeds to bfloat16 (model_executor/model_runner.py "
                     "_extend_forward_kwargs), so in {dtype} soft-token generation runs on bfloat16-rounded "
                     "input embeddings: compare it at the bfloat16 tolerance")


def cum_logprob_from_score(sequence_score: float, num_tokens: int) -> float:
    """A beam's cumulative log-prob from SGLang's `sequence_score` (cum_logprob / num_tokens, length penalty 1.0).

    The server's cum_logprob is a float32 (the beam frontier is a float32 tensor, `beam_group.py`); the score is
    that value divided by the length in float64, so `score * length` is within a few float64 ulps of it and
    rounding to float32 returns it exactly.
    """
    return struct.unpack("f", struct.pack("f", sequence_score * num_tokens))[0]


def _beam_refusal(err: Exception) -> str | None:
    """The server's message when it refused a beam request, else None: HTTP 400 with one of the texts of
    `BeamCoordinator.validate_and_init` ("Beam search ...", "n (..) cannot exceed beam_width", "beam_width (..)
    ...") or the watermark check ("beam search is not supported with watermarking"). Anything else (a contract
    error, say) is not a refusal of beam search and is raised."""
    import re

    _, sep, detail = str(err).partition("answered HTTP 400: ")
    if isinstance(err, RuntimeError) and sep and (
            detail.lower().startswith("beam search") or re.match(r"(n|beam_width) \(\d+\)", detail)):
        return detail
    return None


class SGLangEngine(HTTPEngineBase):
    """The `Engine` protocol over an SGLang server (launched from its environment or given by `url`)."""

    name = "sglang"
    server_key = "sglang"
    missing_hint = f"SGLang {SGLANG_VERSION} is not installed here"
    server_label = "sglang server"
    served_model_name = "workbench"

    def __init__(self, checkpoint, dtype: str = "float32", url: str | None = None, *, request_timeout_s: float = 300.0,
                 max_concurrency: int = 64, multi_item_scoring: bool | None = None, native_beam_search: bool = True,
                 server_options: dict | None = None, log_path=None, **limit_kw):
        """`multi_item_scoring`: None (default) launches with `--enable-mis` when it can work (bfloat16/float16,
        vocabulary > 9999) and reports why not otherwise; True demands it (ValueError when impossible); False
        never. With `url` the server's own flags decide (the request is the same either way).
        `native_beam_search` False always uses the client-side beam loop (e.g. to compare the two)."""
        self._init_common(checkpoint, dtype, url, request_timeout_s, max_concurrency, limit_kw)
        opts = dict(server_options or {})
        opt_mis = opts.pop("enable_mis", None)  # the launcher's spelling; the argument wins when both are given
        if multi_item_scoring is None and opt_mis is not None:
            multi_item_scoring = bool(opt_mis)
        self.multi_item_scoring, self.mis_reason = self._choose_mis(multi_item_scoring, url)
        if self.multi_item_scoring:
            opts["enable_mis"] = True
        # soft-token generation sends input_embeds, which need --disable-radix-cache (the launcher turns it on
        # for soft-token checkpoints unless told otherwise)
        self.input_embeds_ok = url is not None or opts.get("disable_radix_cache", True) is not False
        self.native_beam_search = native_beam_search
        self.beam_refusal: str | None = None  # the server's message if it refused a native beam request
        self._launch_or_connect(url, opts, log_path)

    @property
    def label_candidate_prefix(self) -> tuple[int, ...]:
        """What each item's label scores also condition on: the MIS delimiter placeholder before the item
        (module doc); parity scores the oracle's candidates with this prefix so it compares like with like."""
        return (MIS_DELIMITER_TOKEN_ID,) if self.multi_item_scoring else ()

    def _choose_mis(self, wanted: bool | None, url: str | None) -> tuple[bool | None, str]:
        if url is not None:
            return None, "decided by the server at url (--enable-mis or not); the /v1/score request is the same"
        problems = []
        if self.dtype in FP32_DTYPES:
            problems.append(f"the server runs in {self.dtype} and {NO_FP32_ATTENTION}")
        if self.info.vocab_size <= MIS_DELIMITER_TOKEN_ID:
            problems.append(f"the vocabulary ({self.info.vocab_size}) does not contain the fixed delimiter "
                            f"placeholder {MIS_DELIMITER_TOKEN_ID} (sglang/srt/constants.py), which is embedded")
        if wanted and problems:
            raise ValueError("multi_item_scoring=True is impossible with SGLang " + SGLANG_VERSION + ": "
                             + "; ".join(problems) + ". Use dtype bfloat16/float16, or multi_item_scoring=None/False")
        if wanted is False:
            return False, "off (multi_item_scoring=False): one sequence per item inside SGLang"
        if problems:
            return False, "off: " + "; ".join(problems) + "; one sequence per item inside SGLang"
        return True, "/v1/score on a server launched with --enable-mis"

    @staticmethod
    def static_capabilities() -> Capabilities:
        f = {
            "beam_search_all_beams": FeatureSupport(
                Support.NATIVE, f"SGLang {SGLANG_VERSION} beam search (sglang/srt/beam_search/coordinator.py): one "
                "/generate with sampling_params beam_width = n, ignore_eos; meta_info.beam_results[i].output_ids "
                "and .meta_info.sequence_score (= cum_logprob / length, beam_search/output.py, beam_group.py), "
                "converted to the cumulative log-prob; width 1 and servers that refuse beam requests use the "
                "client-side loop"),
            "trie_constraint": FeatureSupport(
                Support.EMULATED, "SGLang beam search refuses constrained decoding and selects on raw log-probs "
                "(beam_search/coordinator.py): client-side beam loop of one-token /generate requests with "
                "token_ids_logprob = allowed trie children"),
            "soft_token": FeatureSupport(
                Support.NATIVE, "generation: input_embeds built client-side (embedding table + projector; needs "
                "--disable-radix-cache, managers/tokenizer_manager.py); label scoring: /v1/score "
                "embed_override_token_id=<|user|> + query_embed_overrides=[projected vector] (with the other "
                "items under --enable-mis); sequence scoring unsupported (input_embeds prompts get fake ids, so no "
                "meaningful input log-probs; /v1/score reads label tokens only)"),
            "soft_token_beam_search": FeatureSupport(
                Support.NATIVE, "input_embeds + beam_width (validate_and_init does not refuse input_embeds; "
                "constrained: the client-side loop of one-token input_embeds requests)"),
            "multi_item_scoring": FeatureSupport(
                Support.NATIVE, "/v1/score with --enable-mis (label mode, FlashInfer, CUDA; bfloat16/float16 only: "
                "FlashInfer has no float32 attention; needs vocab > 9999 for the fixed delimiter placeholder, "
                "which items also attend to)"),
            "fanout_scoring": FeatureSupport(
                Support.NATIVE, "/generate per candidate with input_token_logprobs (sequence mode)"),
        }
        assert set(f) == set(FEATURES)
        return Capabilities("sglang", f)

    def capabilities(self) -> Capabilities:
        """The static map, adjusted to this instance: MIS on or off (and why), native beams or the loop, dtype."""
        f = dict(self.static_capabilities().features)
        if self.multi_item_scoring is False:
            f["multi_item_scoring"] = FeatureSupport(Support.UNSUPPORTED, self.mis_reason)
        elif self.multi_item_scoring is None:
            f["multi_item_scoring"] = FeatureSupport(Support.NATIVE, self.mis_reason)
        loop = None
        if not self.native_beam_search:
            loop = "native_beam_search=False: client-side beam loop of one-token /generate requests"
        elif self.beam_refusal:
            loop = f"the server refused native beam search ({self.beam_refusal}): client-side beam loop"
        if loop:
            f["beam_search_all_beams"] = FeatureSupport(Support.EMULATED, loop)
            f["soft_token_beam_search"] = FeatureSupport(Support.EMULATED, loop + " with input_embeds")
        if self.dtype != "bfloat16":
            for k in ("soft_token", "soft_token_beam_search"):
                f[k] = FeatureSupport(f[k].status, f"{f[k].reason}; {INPUT_EMBEDS_BF16.format(dtype=self.dtype)}")
        if not self.input_embeds_ok:
            why = ("launched with disable_radix_cache=False, and SGLang refuses input_embeds unless "
                   "--disable-radix-cache (managers/tokenizer_manager.py)")
            f["soft_token_beam_search"] = FeatureSupport(Support.UNSUPPORTED, why)
            f["soft_token"] = FeatureSupport(Support.NATIVE, f"label scoring only: generation {why}")
        return Capabilities("sglang", f)

    # ---- /generate helpers ------------------------------------------------------------------------

    def _input_fields(self, token_ids: Sequence[int], r_prompt) -> dict:
        if not r_prompt.is_soft:
            return {"input_ids": list(token_ids)}
        if not self.input_embeds_ok:
            raise RequestError("soft-token generation needs an SGLang server with --disable-radix-cache (it refuses "
                               "input_embeds otherwise); this one was launched with disable_radix_cache=False")
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
        # beam_width 1 is not a beam request in SGLang (request_beam_width <= 1: plain sampling), and the trie
        # constraint cannot reach its beam search: both run the client-side loop
        if r.constrained or r.beam_width < 2 or not self.native_beam_search or self.beam_refusal:
            return await self._beam_emulated(r)
        try:
            return await self._beam_native(r)
        except RuntimeError as e:
            refusal = _beam_refusal(e)
            if refusal is None:
                raise
            self.beam_refusal = refusal  # reported by capabilities(); later requests go to the loop directly
            warnings.warn(f"SGLang refused native beam search, using the client-side loop: {refusal}", stacklevel=2)
            return await self._beam_emulated(r)

    async def _beam_native(self, r: BeamSearchRequest) -> list[Beam]:
        body = {**self._input_fields(r.prompt.token_ids, r.prompt),
                "sampling_params": {"max_new_tokens": r.max_new_tokens, "beam_width": r.beam_width,
                                    "n": r.beam_width, "ignore_eos": True}}
        out = await self._post("/generate", body, with_model=False)
        results = (out.get("meta_info") or {}).get("beam_results")
        if not results:
            raise RuntimeError("SGLang answered a beam request without meta_info.beam_results (is the server "
                               f"sglang {SGLANG_VERSION}?)")
        beams = []
        for b in results:
            toks = [int(t) for t in b["output_ids"]]
            if len(toks) != r.max_new_tokens:
                # coordinator.py caps the budget at max_req_len - prompt - 5: near the context limit
                raise RuntimeError(f"SGLang returned a beam of {len(toks)} tokens for max_new_tokens "
                                   f"{r.max_new_tokens} (its beam search keeps prompt + new tokens + 5 within the "
                                   "context length); shorten the prompt")
            beams.append(Beam(toks, cum_logprob_from_score(float(b["meta_info"]["sequence_score"]), len(toks))))
        if len(beams) != r.beam_width:
            raise RuntimeError(f"SGLang returned {len(beams)} beams for beam_width {r.beam_width}")
        return beams

    async def _scores(self, r: ScoreRequest) -> list:
        if r.mode == "label":
            return await self._score_label(r)
        if r.prompt.is_soft:
            raise RequestError("sequence-mode scoring with a soft token is unsupported on SGLang "
                               f"{SGLANG_VERSION}: an input_embeds prompt gets fake token ids, so its input "
                               "log-probs mean nothing; use mode 'label'")
        return await self._score_sequence(r)

    async def _score_sequence(self, r: ScoreRequest) -> list[float]:
        p = list(r.prompt.token_ids)

        async def one(c):
            body = {"input_ids": p + list(c), "sampling_params": {"max_new_tokens": 0},
                    "return_logprob": True, "logprob_start_len": len(p)}
            out = await self._post("/generate", body, with_model=False)
            entries = out["meta_info"]["input_token_logprobs"]
            # entries cover positions logprob_start_len.. of the input; keep the candidate's tokens
            vals = [float(e[0]) for e in entries if e is not None and e[0] is not None]
            if len(vals) < len(c):
                raise RuntimeError(f"SGLang returned {len(vals)} input log-probs for a {len(c)}-token candidate")
            return sum(vals[-len(c):])

        return list(await asyncio.gather(*(one(c) for c in r.candidates)))

    async def _score_label(self, r: ScoreRequest) -> list[list[float]]:
        labels = list(dict.fromkeys(r.label_token_ids))  # score_request refuses duplicate label ids
        body = {"query": list(r.prompt.token_ids), "items": [list(c) for c in r.candidates],
                "label_token_ids": labels, "apply_softmax": False, "item_first": False,
                "return_token_logprobs": True}
        if r.prompt.is_soft:
            body["embed_override_token_id"] = int(self.limits.placeholder_id)
            body["query_embed_overrides"] = [self._projected_user_row(r.prompt)]
        out = await self._post("/v1/score", body)
        rows = out.get("token_logprobs")
        if rows is None:
            raise RuntimeError("/v1/score answered without token_logprobs although return_token_logprobs was set "
                               f"(is the server sglang {SGLANG_VERSION}?)")
        if len(rows) != len(r.candidates) or any(len(row) != len(labels) for row in rows):
            raise RuntimeError(f"/v1/score returned token_logprobs of shape {[len(x) for x in rows]} for "
                               f"{len(r.candidates)} items x {len(labels)} labels")
        at = {t: i for i, t in enumerate(labels)}
        return [[float(row[at[t]]) for t in r.label_token_ids] for row in rows]

    def _projected_user_row(self, prompt) -> list[float]:
        """projector(user_vector) as a [hidden] list: the embedding SGLang writes at the <|user|> position."""
        import time

        t0 = time.perf_counter()
        row = self.embedder.embed([self.limits.placeholder_id], prompt.user_vector, 0)[0].tolist()
        self.transport.add(time.perf_counter() - t0, len(row) * 8)
        return row
