"""SGLang and TensorRT-LLM adapters: contract tests against a local stand-in server, plus the real tests.

CONTRACT-ONLY: the stand-in answers with request/response shapes quoted from the pinned versions'
sources; it checks what the adapters send and how they parse, not the engines. Sources:
- SGLang 0.5.23: not quoted but loaded from the pinned wheel at test time (tests/sglang_wheel.py):
  the stand-in validates every body with SGLang's own models (`GenerateReqInput`, the `/generate`
  contract gate, `SamplingParams`, `ScoringRequest`) and builds its answers with SGLang's code
  (`ScoringResponse`, `beam_search/output.py`); see the SGLang section below and
  tests/test_sglang_wheel_contract.py. Without the wheel the SGLang stand-in tests skip, saying so.
- TensorRT-LLM 1.3.0rc20: `tensorrt_llm/serve/openai_protocol.py` (`CompletionRequest` with
  `extra="forbid"`; `CompletionResponse.choices[]`: index, text, token_ids, logprobs
  {text_offset, token_logprobs, tokens, top_logprobs}, context_logits, finish_reason).

The real tests (a live SGLang / TensorRT-LLM server against the torch engine) need a CUDA GPU and
the engine's own environment; here they skip with that reason. scripts/validate_gpu_engines.sh runs
them on a GPU host.
"""

from __future__ import annotations

import importlib.util
import json
import math
import threading
import time
import types

import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from workbench.engines.base import BeamSearchRequest, EngineUnavailable, Prompt, ScoreRequest, Support

pytestmark = pytest.mark.timeout(120)

@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from workbench.testing import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("gpu-contract") / "ck", n_items=40, levels=(4, 4),
                                  hidden_size=32, num_layers=1, num_attention_heads=2, head_dim=16, vocab_base=50)


class StandIn:
    """A uvicorn server in a thread; `app` records every request body it gets."""

    def __init__(self, app):
        import uvicorn

        from workbench.engines.remote.launcher import free_port

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        import httpx

        self.thread.start()
        for _ in range(100):
            try:
                httpx.get(f"{self.url}/v1/models", timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("stand-in server did not start")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _models_route(app, owned_by):
    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "workbench", "object": "model", "owned_by": owned_by}]}


# ---- SGLang ---------------------------------------------------------------------------------------
#
# The stand-in speaks SGLang 0.5.23 with the wheel's own pieces (tests/sglang_wheel.py): every /generate body
# goes through the server's contract gate (api_types.GenerateRequest) and a GenerateReqInput model that refuses
# the keys the real server would silently drop, sampling_params through SamplingParams' fields; /v1/score
# bodies through ScoringRequest; answers are built by the wheel's code (beam_results by beam_search/output.py
# with BeamGroup.beam_score, scores by _convert_logprobs_to_scores, ScoringResponse(...).model_dump() as
# serving_score.py does) and every /generate answer is checked as an api_types.GenerateResponse. Without the
# wheel the SGLang tests skip (sglang_wheel.skip_reason).


def sglang_app(received: list, vocab: int, *, disable_radix_cache: bool = True, refuse_beams: str | None = None,
               table=None):
    """SGLang's HTTP behaviour as far as the adapter uses it. `disable_radix_cache`: the server flag (input_embeds
    are refused without it); `refuse_beams`: refuse beam requests with this message (validate_and_init's 400);
    `table`: the checkpoint's [vocab, hidden] embedding table, so input_embeds rows map back to their token ids."""
    import sglang_wheel as sw
    from pydantic import ValidationError

    gen_model, _ = sw.generate_req_input()
    sm = sw.scoring_models()
    sp_fields = sw.sampling_params_fields()
    to_scores = sw.method(sw.SCORE_MIXIN, "TokenizerManagerScoreMixin", "_convert_logprobs_to_scores")
    app = FastAPI()
    _models_route(app, "sglang")
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4096, vocab))  # deterministic "model": logits depend on the input ids
    logits[:, 3] = -900.0  # token 3: a log-prob whose exp underflows to 0.0 in `scores`
    row_ids = {} if table is None else {np.asarray(r, dtype=np.float32).tobytes(): i for i, r in enumerate(table)}

    def logprobs_after(ids):
        row = logits[(sum(ids) * 31 + len(ids)) % len(logits)]
        return row - np.log(np.exp(row).sum())

    def embed_ids(rows):  # a table row is its token; another row (the projected user vector) hashes its values
        return [row_ids.get(np.asarray(x, dtype=np.float32).tobytes(), int(abs(sum(x)) * 1000) % vocab) for x in rows]

    def beam_search(ids, k, steps):  # SGLang's selection: float32 cumulative log-probs, top 2k per row, best k
        beams = [([], np.float32(0.0))]
        for _ in range(steps):
            cand = []
            for toks, cum in beams:
                lp = logprobs_after(ids + toks)
                cand += [(np.float32(cum + np.float32(lp[t])), toks + [int(t)]) for t in np.argsort(-lp)[: 2 * k]]
            cand.sort(key=lambda c: -c[0])
            beams = [(t, c) for c, t in cand[:k]]
        return [(t, float(c)) for t, c in beams]

    def refuse(message, status=400):  # http_server._create_error_response
        return JSONResponse({"error": {"message": message}}, status_code=status)

    @app.post("/generate")
    async def generate(req: Request):
        body = await req.json()
        received.append(("/generate", body))
        gate = sw.contract_error(body)
        if gate is not None:  # http_server.generate_request: the contract gate's text
            return JSONResponse({"error": gate}, status_code=400)
        try:
            gen_model.model_validate(body)
        except ValidationError as e:
            return refuse(f"not a GenerateReqInput (unknown keys would be dropped silently): {e}", 422)
        sp = body.get("sampling_params") or {}
        if set(sp) - sp_fields:
            return refuse(f"SamplingParams got unexpected keyword arguments {sorted(set(sp) - sp_fields)}")
        if body.get("input_embeds") is not None and not disable_radix_cache:
            return refuse(sw.message(sw.TOKENIZER_MANAGER, "input_embeds is provided"))
        ids = body.get("input_ids") or embed_ids(body["input_embeds"])
        meta = {"id": "abc", "prompt_tokens": len(ids), "completion_tokens": 1, "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": 1}}
        width = sp.get("beam_width") or 1
        if width > 1:
            if refuse_beams:
                return refuse(refuse_beams)
            if body.get("return_logprob"):
                return refuse(sw.message(sw.BEAM_COORDINATOR, "Beam search does not support return_logprob"))
            if (sp.get("n") or 1) > width:
                return refuse(f"n ({sp['n']}) cannot exceed beam_width ({width}).")
            beams = beam_search(ids, width, sp["max_new_tokens"])[: sp.get("n") or 1]
            out = sw.beam_generate_response(beams, meta)
        else:
            lp = logprobs_after(ids)
            meta["output_token_logprobs"] = [[float(lp.max()), int(lp.argmax()), None]]
            if body.get("top_logprobs_num"):
                top = np.argsort(-lp)[: body["top_logprobs_num"]]
                meta["output_top_logprobs"] = [[[float(lp[t]), int(t), None] for t in top]]
            if body.get("token_ids_logprob"):
                meta["output_token_ids_logprobs"] = [[[float(lp[t]), int(t), None] for t in body["token_ids_logprob"]]]
            start = body.get("logprob_start_len", -1)
            if body.get("return_logprob") and start is not None and start >= 0:
                entries = [[None, ids[0], None]] if start == 0 else []
                for j in range(max(start, 1), len(ids)):
                    entries.append([float(logprobs_after(ids[:j])[ids[j]]), ids[j], None])
                meta["input_token_logprobs"] = entries
            out = {"text": "", "output_ids": [int(lp.argmax())], "meta_info": meta}
        sw.api_types().GenerateResponse.from_json_value(out)  # raises on a shape the real server never sends
        return out

    @app.post("/v1/score")
    async def score(req: Request):
        body = await req.json()
        received.append(("/v1/score", body))
        unknown = set(body) - set(sm.ScoringRequest.model_fields)
        if unknown:  # pydantic's default: the real server would ignore them silently
            return refuse(f"unknown fields {sorted(unknown)} (SGLang ignores them silently)", 422)
        try:
            r = sm.ScoringRequest.model_validate(body)
        except ValidationError as e:
            return JSONResponse({"detail": str(e)}, status_code=422)
        labels = r.label_token_ids
        if labels is None:
            return refuse("label_token_ids is required for generation (CausalLM) models.")
        if len(set(labels)) != len(labels):
            return refuse(sw.message(sw.SCORE_MIXIN, "label_token_ids must not contain duplicate"))
        query = list(r.query)
        if r.query_embed_overrides is not None:  # _build_token_id_inputs: one override per placeholder occurrence
            tok = r.embed_override_token_id
            if tok is None:
                return refuse(sw.message(sw.SCORE_MIXIN, "embed_override_token_id is required"))
            pos = [i for i, t in enumerate(query) if t == tok]
            if len(pos) != len(r.query_embed_overrides):
                return refuse(f"query contains {len(pos)} occurrences of embed_override_token_id={tok}, but "
                              f"{len(r.query_embed_overrides)} override embeddings were provided.")
            for i, emb in zip(pos, r.query_embed_overrides):
                query[i] = embed_ids([emb])[0]
        scores, token_logprobs = [], []
        for item in r.items:
            lp = logprobs_after(query + list(item))
            got = {t: float(lp[t]) for t in labels}  # _extract_logprobs_for_tokens
            scores.append(to_scores(None, got, labels, r.apply_softmax, r.temperature))
            token_logprobs.append([got[t] for t in labels])
        n = sum(len(query) + len(i) for i in r.items)
        return sm.ScoringResponse(scores=scores, token_logprobs=token_logprobs if r.return_token_logprobs else None,
                                  model=r.model, usage=sm.UsageInfo(prompt_tokens=n, total_tokens=n)).model_dump()

    app.state.logprobs_after = logprobs_after
    app.state.beam_search = beam_search
    app.state.embed_ids = embed_ids
    return app


@pytest.mark.contract_only
async def test_sglang_adapter_contract(ckpt):
    import sglang_wheel

    sglang_wheel.require_wheel()
    from workbench.engines.remote.http_common import PromptEmbedder
    from workbench.engines.remote.sglang import SGLangEngine

    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    received: list = []
    app = sglang_app(received, vocab, table=PromptEmbedder(ckpt).embed(range(vocab)).numpy())
    with StandIn(app) as srv:
        eng = SGLangEngine(ckpt, url=srv.url)
        try:
            p = Prompt.of([5, 6, 7, 8])
            lpa = app.state.logprobs_after
            # beam search is native: ONE /generate with beam_width = n = width, ignore_eos, no log-prob options
            res = (await eng.beam_search([BeamSearchRequest(p, 3, 2)]))[0]
            assert res.success, res.error
            assert len(received) == 1
            path, body = received[0]
            assert path == "/generate" and body["input_ids"] == [5, 6, 7, 8] and "model" not in body
            assert body["sampling_params"] == {"max_new_tokens": 2, "beam_width": 3, "n": 3, "ignore_eos": True}
            assert not {"return_logprob", "top_logprobs_num", "token_ids_logprob"} & set(body)
            # the beams and their float32 cumulative log-probs come back exactly (sequence_score * length)
            want = app.state.beam_search([5, 6, 7, 8], 3, 2)
            assert [(b.token_ids, b.cum_logprob) for b in res.beams] == [(t, c) for t, c in want]
            b = res.beams[0]
            exact = lpa([5, 6, 7, 8])[b.token_ids[0]] + lpa([5, 6, 7, 8, b.token_ids[0]])[b.token_ids[1]]
            assert abs(b.cum_logprob - exact) < 1e-5  # float32 accumulation
            caps = eng.capabilities()
            assert caps.features["beam_search_all_beams"].status == Support.NATIVE

            # the client-side loop gives the same beams (it is the reference for the conversion)
            received.clear()
            loop = SGLangEngine(ckpt, url=srv.url, native_beam_search=False)
            res_loop = (await loop.beam_search([BeamSearchRequest(p, 3, 2)]))[0]
            await loop.close()
            assert [x.token_ids for x in res_loop.beams] == [x.token_ids for x in res.beams]
            assert max(abs(x.cum_logprob - y.cum_logprob) for x, y in zip(res_loop.beams, res.beams)) < 1e-5
            first = received[0][1]
            assert first["top_logprobs_num"] == 3 and first["sampling_params"]["max_new_tokens"] == 1
            assert loop.capabilities().features["beam_search_all_beams"].status == Support.EMULATED

            # width 1 is not a beam request in SGLang (plain sampling): the loop runs it, greedily
            received.clear()
            res = (await eng.beam_search([BeamSearchRequest(p, 1, 2)]))[0]
            assert res.success and len(res.beams) == 1
            assert all("beam_width" not in b["sampling_params"] for _, b in received) and len(received) == 2

            # constrained: the loop, with token_ids_logprob carrying the trie's allowed children
            received.clear()
            res = (await eng.beam_search([BeamSearchRequest(p, 2, 3, constrained=True)]))[0]
            assert res.success, res.error
            first = [b for path, b in received if path == "/generate"][0]
            layout = eng.info.meta.layout
            lo = layout.item_level_offset(0)
            assert set(first["token_ids_logprob"]) <= set(range(lo, lo + layout.item_codebooks[0]))
            assert all("beam_width" not in b["sampling_params"] for _, b in received)

            # label scoring -> /v1/score with token-id items, apply_softmax false, return_token_logprobs: the
            # log-probs are SGLang's token_logprobs, exact; token 3's probability underflows to 0.0 in `scores`
            # (log of it would be -inf), and a repeated label id is sent once (SGLang refuses duplicates)
            received.clear()
            cands = ((10, 11), (12, 13), (14, 15))
            s = (await eng.score([ScoreRequest(p, cands, mode="label", label_token_ids=(3, 4, 3))]))[0]
            assert s.success, s.error
            path, body = received[0]
            assert path == "/v1/score" and body["query"] == [5, 6, 7, 8] and body["items"] == [list(c) for c in cands]
            assert body["label_token_ids"] == [3, 4] and body["apply_softmax"] is False and body["item_first"] is False
            assert body["return_token_logprobs"] is True and body["model"] == "workbench"
            assert s.scores[1] == [float(lpa([5, 6, 7, 8, 12, 13])[t]) for t in (3, 4, 3)]
            assert all(math.isfinite(x) for row in s.scores for x in row)

            # sequence scoring -> /generate with logprob_start_len = prompt length, max_new_tokens 0 (as SGLang's
            # own scorer); the sum of the candidate's input log-probs
            received.clear()
            s = (await eng.score([ScoreRequest(p, cands)]))[0]
            assert s.success, s.error
            want = lpa([5, 6, 7, 8])[10] + lpa([5, 6, 7, 8, 10])[11]
            assert abs(s.scores[0] - want) < 1e-9
            assert all(b["logprob_start_len"] == 4 and b["sampling_params"] == {"max_new_tokens": 0}
                       for _, b in received)

            # soft token, label mode -> ONE /v1/score with the score-time embedding override (sglang 0.5.23
            # ScoringRequest.embed_override_token_id / query_embed_overrides): the projected user vector
            # replaces the <|user|> embedding, the rest of the prompt stays token ids
            ph = layout.placeholder_id
            vec = np.linspace(-1, 1, 16)
            sp = Prompt.of([5, ph, 7], user_vector=vec, placeholder_pos=1)
            received.clear()
            s = (await eng.score([ScoreRequest(sp, cands, mode="label", label_token_ids=(4,))]))[0]
            assert s.success, s.error
            assert len(received) == 1 and received[0][0] == "/v1/score"
            body = received[0][1]
            assert body["query"] == [5, ph, 7] and body["embed_override_token_id"] == ph
            want_row = eng.embedder.embed([ph], vec, 0)[0]  # projector(vec), [hidden]
            assert np.allclose(body["query_embed_overrides"], [want_row.numpy()], atol=1e-6)
            assert len(body["query_embed_overrides"][0]) == eng.info.hidden_size
            ovr = app.state.embed_ids([want_row.tolist()])[0]
            assert s.scores[2][0] == float(lpa([5, ovr, 7, 14, 15])[4])
            # a different user vector changes the scores (the override is not dropped)
            s2 = (await eng.score([ScoreRequest(Prompt.of([5, ph, 7], user_vector=-vec + 0.3, placeholder_pos=1),
                                                cands, mode="label", label_token_ids=(4,))]))[0]
            assert s2.success and s2.scores != s.scores
            # sequence mode with a soft token stays refused with the reason
            s = (await eng.score([ScoreRequest(sp, cands)]))[0]
            assert not s.success and "unsupported" in s.error
            # generation with a soft token: input_embeds rows and native beam search
            received.clear()
            res = (await eng.beam_search([BeamSearchRequest(sp, 2, 2)]))[0]
            assert res.success, res.error
            assert len(received) == 1 and len(received[0][1]["input_embeds"]) == 3
            assert received[0][1]["sampling_params"]["beam_width"] == 2 and "input_ids" not in received[0][1]
            assert [(b.token_ids, b.cum_logprob) for b in res.beams] == app.state.beam_search([5, ovr, 7], 2, 2)
        finally:
            await eng.close()


# ---- TensorRT-LLM ---------------------------------------------------------------------------------


def trtllm_app(received: list, vocab: int):
    app = FastAPI()
    _models_route(app, "tensorrt_llm")
    # CompletionRequest's fields as recorded from TensorRT-LLM 1.3.0rc2x (tests/trtllm_api_facts.json; checked
    # field by field in tests/test_trtllm_source_contract.py)
    facts = json.loads((__import__("pathlib").Path(__file__).parent / "trtllm_api_facts.json").read_text())
    allowed = set(facts["openai_protocol"]["CompletionRequest"])

    @app.post("/v1/completions")
    async def completions(req: Request):
        body = await req.json()
        received.append(body)
        extra = set(body) - allowed
        if extra:  # CompletionRequest has extra="forbid": answer like the server's validation error
            return JSONResponse({"object": "error", "message": f"extra fields not permitted: {sorted(extra)}",
                                 "type": "BadRequestError", "param": None, "code": 400}, status_code=400)
        prompt = body["prompt"]
        if body.get("use_beam_search"):
            choices = []
            for i in range(body["n"]):
                toks = [(7 + i + k) % vocab for k in range(body["max_tokens"])]
                lps = [-0.5 * (i + 1) - 0.1 * k for k in range(body["max_tokens"])]
                choices.append({"index": i, "text": "", "token_ids": toks, "finish_reason": "length", "stop_reason": None,
                                "logprobs": {"text_offset": [], "token_logprobs": lps, "tokens": [], "top_logprobs": []}})
        else:
            rows = [[math.sin(0.1 * (t + 1) * (v + 1)) for v in range(vocab)] for t in prompt]
            choices = [{"index": 0, "text": "", "token_ids": [1], "finish_reason": "length", "stop_reason": None,
                        "logprobs": None, "context_logits": rows if body.get("return_context_logits") else None}]
        return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": body["model"], "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + 1, "completion_tokens": 1}}

    return app


@pytest.mark.contract_only
async def test_trtllm_adapter_contract(ckpt):
    from workbench.engines.remote.trtllm import TRTLLMEngine, _log_softmax

    vocab = __import__("json").loads((ckpt / "config.json").read_text())["vocab_size"]
    received: list = []
    with StandIn(trtllm_app(received, vocab)) as srv:
        eng = TRTLLMEngine(ckpt, url=srv.url)
        try:
            p = Prompt.of([5, 6, 7, 8])
            res = (await eng.beam_search([BeamSearchRequest(p, 3, 2)]))[0]
            assert res.success, res.error
            body = received[0]
            assert body["use_beam_search"] is True and body["n"] == 3 and body["best_of"] == 3
            assert body["prompt"] == [5, 6, 7, 8] and body["ignore_eos"] is True and body["length_penalty"] == 0.0
            assert body["model"] == "workbench"  # discovered through /v1/models
            assert [round(b.cum_logprob, 6) for b in res.beams] == [-1.1, -2.1, -3.1]
            assert res.beams[0].token_ids == [7, 8]

            received.clear()
            s = (await eng.score([ScoreRequest(p, ((10, 11),)), ScoreRequest(p, ((10, 11),), mode="label",
                                                                             label_token_ids=(3, 4))]))
            assert all(x.success for x in s), [x.error for x in s]
            assert all(b["return_context_logits"] is True for b in received)
            rows = [[math.sin(0.1 * (t + 1) * (v + 1)) for v in range(vocab)] for t in [5, 6, 7, 8, 10, 11]]
            want = _log_softmax(rows[3])[10] + _log_softmax(rows[4])[11]
            assert abs(s[0].scores[0] - want) < 1e-9
            assert abs(s[1].scores[0][1] - _log_softmax(rows[5])[4]) < 1e-9

            # what trtllm-serve cannot take over HTTP is refused with the reason, never silently dropped
            c = (await eng.beam_search([BeamSearchRequest(p, 2, 2, constrained=True)]))[0]
            assert not c.success and "trie_constraint" in c.error
        finally:
            await eng.close()


# ---- TensorRT-LLM scoring layer (in_trtllm/scoring_server.py) with a fake LLM object ---------------------
#
# CONTRACT-ONLY: the layer's FastAPI app runs for real; the `LLM` objects behind it are stand-ins that
# record the calls and answer in the shapes of TensorRT-LLM 1.3.0rc20's LLM API (`LLM.encode ->
# [EncoderOutput(logits [T, vocab])]`, PR #12801; `LLM.generate -> RequestOutput(context_logits,
# outputs=[CompletionOutput(token_ids, cumulative_logprob)])`). It checks request shaping and response
# parsing of the layer and of the adapter's scoring path, not TensorRT-LLM.


class FakeLogits:
    """Deterministic 'model': the logits after a prefix depend on the prefix (and the user vector)."""

    def __init__(self, vocab: int):
        self.table = np.random.default_rng(1).normal(size=(2048, vocab)) * 3

    def rows(self, ids, user_vector=None) -> np.ndarray:  # [T, vocab]: row t predicts token t+1
        salt = 0 if user_vector is None else int(abs(sum(user_vector)) * 977)
        return np.stack([self.table[(sum(ids[: t + 1]) * 31 + t + salt) % len(self.table)] for t in range(len(ids))])


class FakeEncodeLLM:
    def __init__(self, model: FakeLogits):
        self.model, self.calls = model, []

    # LLM.encode's signature in 1.3.0rc2x (tensorrt_llm/llmapi/llm.py); unknown keywords land in **model_kwargs
    def encode(self, inputs, add_special_tokens=True, batch_indexed_model_output=True, copy_logits_to_host=True,
               return_raw_logits=False, **model_kwargs):
        self.calls.append((inputs, batch_indexed_model_output, model_kwargs))
        outs = [types.SimpleNamespace(logits=self.model.rows(i["prompt_token_ids"]),
                                      prompt_token_ids=i["prompt_token_ids"]) for i in inputs]
        return outs


class FakeGenLLM:
    def __init__(self, model: FakeLogits):
        self.model, self.calls = model, []

    def generate(self, inputs, sampling_params=None, use_tqdm=True, lora_request=None, prompt_adapter_request=None,
                 kv_cache_retention_config=None, disaggregated_params=None, scheduling_params=None,
                 conversation_params=None, cache_salt=None, priority=0.5):  # LLM.generate, 1.3.0rc2x
        import torch

        single = isinstance(inputs, dict)
        self.calls.append((inputs, sampling_params))
        outs = []
        for inp in ([inputs] if single else inputs):
            ids = inp["prompt_token_ids"]
            vec = (inp.get("multi_modal_embeddings") or {}).get("user", [None])[0]
            sp = sampling_params
            if sp.kw.get("use_beam_search"):  # greedy-ish fake beams; the logits processor masks each step
                w, T = sp.kw["n"], sp.kw["max_tokens"]
                beams = [([], 0.0)]
                for _ in range(T):
                    cand = []
                    for toks, cum in beams:
                        logits = torch.tensor(self.model.rows(ids + toks, vec)[-1:][None])  # [1, 1, vocab]
                        if sp.kw.get("logits_processor") is not None:
                            sp.kw["logits_processor"](0, logits, [ids + toks], None, None)
                        lp = torch.log_softmax(logits.flatten().double(), -1)
                        cand += [(cum + float(lp[t]), toks + [t]) for t in torch.topk(lp, w).indices.tolist()
                                 if torch.isfinite(lp[t])]
                    beams = [(t, c) for c, t in sorted(cand, key=lambda x: -x[0])[:w]]
                outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=t, cumulative_logprob=c)
                                                           for t, c in beams], context_logits=None))
            else:
                assert sp.kw.get("return_context_logits") is True and sp.kw.get("max_tokens") == 1
                outs.append(types.SimpleNamespace(context_logits=self.model.rows(ids, vec), outputs=[]))
        return outs[0] if single else outs


class FakeAPI:
    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class LogitsProcessor:  # tensorrt_llm.sampling_params.LogitsProcessor: subclasses implement __call__
        pass


def _layer_logprobs(model, ids, vec=None):
    from workbench.engines.in_trtllm.scoring_server import _log_softmax_rows

    return _log_softmax_rows(model.rows(ids, vec))


@pytest.mark.contract_only
async def test_trtllm_scoring_layer_contract(ckpt):
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("tensorrt_llm is installed: the real layer is validated by scripts/validate_gpu_engines.sh")
    from workbench.model.checkpoint import read_meta
    from workbench.engines.remote.trtllm import TRTLLMEngine
    from workbench.engines.in_trtllm.scoring_server import LLMScorer, create_app
    from workbench.sids.layout import Catalog

    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    model = FakeLogits(vocab)
    enc, gen = FakeEncodeLLM(model), FakeGenLLM(model)
    meta = read_meta(ckpt)
    catalog = Catalog(np.load(ckpt / "catalog.npz")["item_codes"], meta.layout)
    scorer = LLMScorer(enc, gen, FakeAPI, catalog=catalog, vocab_size=vocab)
    with StandIn(create_app(scorer)) as layer, StandIn(trtllm_app([], vocab)) as serve:
        import httpx

        # the layer's own HTTP shape (SGLang /v1/score shape plus mode/logprobs)
        async with httpx.AsyncClient(base_url=layer.url) as c:
            r = await c.post("/v1/score", json={"query": [5, 6], "items": [[10], [11, 12]], "label_token_ids": [3, 4]})
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["object"] == "scoring" and len(out["scores"]) == 2 and len(out["scores"][0]) == 2
            assert np.allclose(out["scores"], np.exp(out["logprobs"]))
            bad = await c.post("/v1/score", json={"query": [5], "items": [[vocab + 5]], "label_token_ids": [3]})
            assert bad.status_code == 400 and "vocabulary" in bad.json()["message"]
            assert (await c.get("/health")).json()["multi_item"] == "batched"
        # LLM.encode got one batch with every query+item, token-indexed logits
        inputs, batch_indexed, kw = enc.calls[0]
        assert inputs == [{"prompt_token_ids": [5, 6, 10]}, {"prompt_token_ids": [5, 6, 11, 12]}]
        assert batch_indexed is False and kw == {}

        eng = TRTLLMEngine(ckpt, url=serve.url, scoring_url=layer.url)
        try:
            caps = eng.capabilities()
            assert all(caps.supports(f) for f in ("multi_item_scoring", "soft_token", "trie_constraint",
                                                  "soft_token_beam_search"))
            p = Prompt.of([5, 6, 7, 8])
            cands = ((10, 11), (12, 13), (14,))
            seq, lab = await eng.score([ScoreRequest(p, cands), ScoreRequest(p, cands, mode="label",
                                                                             label_token_ids=(3, 4))])
            assert seq.success and lab.success, (seq.error, lab.error)
            lp = _layer_logprobs(model, [5, 6, 7, 8, 10, 11])
            assert abs(seq.scores[0] - (lp[3, 10] + lp[4, 11])) < 1e-9
            assert abs(lab.scores[2][1] - _layer_logprobs(model, [5, 6, 7, 8, 14])[-1, 4]) < 1e-9

            # soft token: the raw user vector rides as the 'user' multimodal embedding to the plugin
            ph = meta.layout.placeholder_id
            vec = np.linspace(0.5, 1.5, 16)
            sp = Prompt.of([5, ph, 7], user_vector=vec, placeholder_pos=1)
            gen.calls.clear()
            s = (await eng.score([ScoreRequest(sp, cands)]))[0]
            assert s.success, s.error
            prompts, params = gen.calls[0]
            assert prompts[0]["prompt_token_ids"] == [5, ph, 7, 10, 11]
            assert np.allclose(prompts[0]["multi_modal_embeddings"]["user"][0], vec)
            assert params.kw["return_context_logits"] is True and params.kw["max_tokens"] == 1
            lp = _layer_logprobs(model, [5, ph, 7, 10, 11], list(vec))
            assert abs(s.scores[0] - (lp[2, 10] + lp[3, 11])) < 1e-9

            # soft-token beam search -> generate() with use_beam_search, n = best_of, no length penalty
            gen.calls.clear()
            b = (await eng.beam_search([BeamSearchRequest(sp, 3, 2)]))[0]
            assert b.success, b.error
            assert len(b.beams) == 3 and b.beams[0].cum_logprob >= b.beams[-1].cum_logprob
            inp, params = gen.calls[0]
            assert params.kw["use_beam_search"] and params.kw["n"] == params.kw["best_of"] == 3
            assert params.kw["length_penalty"] == 0.0 and params.kw["max_tokens"] == 2
            assert "multi_modal_embeddings" in inp

            # constrained: a per-request logits processor keeps every step inside the trie, and the beams
            # are re-scored with raw (not renormalized) log-probs
            gen.calls.clear()
            b = (await eng.beam_search([BeamSearchRequest(p, 2, catalog.depth, constrained=True)]))[0]
            assert b.success, b.error
            valid = {tuple(catalog.sid_tokens(i)) for i in range(catalog.n_items)}
            assert all(tuple(x.token_ids) in valid for x in b.beams)
            assert isinstance(gen.calls[0][1].kw["logits_processor"], FakeAPI.LogitsProcessor)
            raw = _layer_logprobs(model, [5, 6, 7, 8] + b.beams[0].token_ids)
            want = sum(raw[3 + j, t] for j, t in enumerate(b.beams[0].token_ids))
            assert abs(b.beams[0].cum_logprob - want) < 1e-9
            # plain beam search still goes to trtllm-serve
            b = (await eng.beam_search([BeamSearchRequest(p, 3, 2)]))[0]
            assert b.success and [round(x.cum_logprob, 6) for x in b.beams] == [-1.1, -2.1, -3.1]
        finally:
            await eng.close()


@pytest.mark.contract_only
def test_trtllm_scoring_layer_packed_call_and_unavailable(ckpt):
    """The packed multi-item call of 1.3.0rc2x (PR #14693: `multi_item_part_lens` in the input, no extra
    keyword), float32 refused for it, and the clear error without tensorrt_llm."""
    from workbench.engines.in_trtllm.scoring_server import LLMScorer, ScoreJob, build_scorer, packed_sequence

    seq, delims = packed_sequence([5, 6], [[10, 11], [12]], 99)
    assert seq == [5, 6, 99, 10, 11, 99, 12, 99] and delims == [2, 5, 7]
    vocab = 120
    model = FakeLogits(vocab)
    enc = FakeEncodeLLM(model)
    scorer = LLMScorer(enc, None, FakeAPI, vocab_size=vocab, multi_item=True, mis_delimiter=99)
    out = scorer.score(ScoreJob((5, 6), ((10, 11), (12,)), "label", (3,)))
    inputs, batch_indexed, model_kwargs = enc.calls[0]
    assert inputs == [{"prompt_token_ids": seq, "multi_item_part_lens": [2, 2, 1]}]
    assert batch_indexed is False and model_kwargs == {}  # nothing reaches the model's forward
    lp = _layer_logprobs(model, seq)
    assert out == [[float(lp[4, 3])], [float(lp[6, 3])]]  # read at each item's last token
    with pytest.raises(ValueError, match="bfloat16"):  # packed multi-item scoring has no float32 path
        build_scorer(ckpt, "float32", multi_item="packed")
    if importlib.util.find_spec("tensorrt_llm") is None:
        with pytest.raises(EngineUnavailable, match="tensorrt_llm"):
            build_scorer(ckpt)


def test_launcher_specs_for_pinned_flags(ckpt, monkeypatch):
    """sglang 0.5.23 takes --enable-mis (no --multi-item-scoring-delimiter), never in float32 (FlashInfer), and
    --disable-radix-cache for soft-token checkpoints; the TRT layer runs from the trtllm env. (Every SGLang flag
    is checked against the wheel's server args in tests/test_sglang_wheel_contract.py.)"""
    import sys

    from workbench.engines.remote import launcher

    monkeypatch.setenv("WORKBENCH_SGLANG_PYTHON", sys.executable)
    monkeypatch.setenv("WORKBENCH_TRTLLM_PYTHON", sys.executable)
    argv = launcher.sglang_spec(ckpt, "bfloat16", enable_mis=True).argv
    assert "--enable-mis" in argv and argv[argv.index("--attention-backend") + 1] == "flashinfer"
    assert "--multi-item-scoring-delimiter" not in argv
    assert "--disable-radix-cache" in argv  # the soft-token checkpoint sends input_embeds
    with pytest.raises(ValueError, match="FlashInfer"):
        launcher.sglang_spec(ckpt, "float32", enable_mis=True)
    spec = launcher.trtllm_scoring_spec(ckpt, port=8123, multi_item="packed")
    assert spec.argv[:3] == (sys.executable, "-m", "workbench.engines.in_trtllm.scoring_server")
    assert spec.argv[spec.argv.index("--checkpoint") + 1] == str(ckpt.resolve()) and spec.url.endswith(":8123")
    assert spec.argv[spec.argv.index("--multi-item") + 1] == "packed" and "--mis-kwarg" not in spec.argv
    # trtllm-serve: no --dtype flag; the dtype and KV share travel in the --extra_llm_api_options YAML
    monkeypatch.setenv("WORKBENCH_TRTLLM_BIN", sys.executable)
    targv = launcher.trtllm_spec(ckpt, "bfloat16", port=8124).argv
    assert "--dtype" not in targv and "--extra_llm_api_options" in targv


# ---- availability and the real (GPU) tests ----------------------------------------------------------


@pytest.mark.parametrize("name", ["sglang", "trtllm"])
def test_absent_engine_raises_clear_error(name, ckpt, monkeypatch):
    from workbench.engines import registry

    monkeypatch.setenv({"sglang": "WORKBENCH_SGLANG_PYTHON", "trtllm": "WORKBENCH_TRTLLM_BIN"}[name], "/nonexistent")
    ok, how = registry.availability(name)
    assert not ok and "GPU host" in how
    with pytest.raises(EngineUnavailable, match="not available here"):
        registry.create_engine(name, checkpoint=ckpt)
    ok, _, caps = registry.static_capabilities(name)
    assert all(fs.status in (Support.NOT_RUN_HERE, Support.UNSUPPORTED) for fs in caps.features.values())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sglang", "trtllm"])
async def test_real_engine_parity(name, tmp_path):
    from workbench.engines import registry

    ok, how = registry.availability(name)
    if not ok:
        pytest.skip(f"{name} cannot run here (needs a CUDA GPU and its own environment): {how}")
    from workbench.engines.parity import run_parity
    from workbench.testing import make_random_checkpoint

    ck = make_random_checkpoint(tmp_path / "ck", num_attention_heads=2, head_dim=32)
    report = await run_parity(name, ck)
    assert report["ok"], report
