"""SGLang and TensorRT-LLM adapters: contract tests against a local stand-in server, plus the real tests.

CONTRACT-ONLY: the stand-in answers with request/response shapes quoted from the pinned versions'
sources; it checks what the adapters send and how they parse, not the engines. Sources:
- SGLang 0.5.23: `python/sglang/srt/entrypoints/openai/protocol.py` (`ScoringRequest`: query,
  items, label_token_ids, apply_softmax, item_first, model; `ScoringResponse`: scores [[p per
  label]], model, usage, object="scoring") and `python/sglang/srt/managers/io_struct.py`
  (`GenerateReqInput`); `/generate` `meta_info` log-probs are `[logprob, token_id, text|null]`
  triples (`tokenizer_manager.py`, `convert_logprob_style`).
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

        from workbench.engines.launcher import free_port

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


def sglang_app(received: list, vocab: int):
    app = FastAPI()
    _models_route(app, "sglang")
    rng = np.random.default_rng(0)
    table = rng.normal(size=(4096, vocab))  # deterministic "model": logits depend on the last input token

    def logprobs_after(ids):
        row = table[(sum(ids) * 31 + len(ids)) % len(table)]
        return row - np.log(np.exp(row).sum())

    @app.post("/generate")
    async def generate(req: Request):
        body = await req.json()
        received.append(("/generate", body))
        ids = body.get("input_ids") or [int(abs(x[0]) * 1000) % vocab for x in body["input_embeds"]]
        lp = logprobs_after(ids)
        meta = {"id": "abc", "prompt_tokens": len(ids), "completion_tokens": 1, "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": 1},
                "output_token_logprobs": [[float(lp.max()), int(lp.argmax()), None]]}
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
        return {"text": "", "output_ids": [int(lp.argmax())], "meta_info": meta}

    score_fields = {"query", "items", "embed_override_token_id", "query_embed_overrides", "item_embed_overrides",
                    "label_token_ids", "apply_softmax", "temperature", "return_token_logprobs", "item_first",
                    "return_pooled_hidden_states", "score_extraction_token", "model"}  # ScoringRequest, 0.5.23

    @app.post("/v1/score")
    async def score(req: Request):
        body = await req.json()
        received.append(("/v1/score", body))
        unknown = set(body) - score_fields
        if unknown:
            return JSONResponse({"object": "error", "message": f"unknown fields {sorted(unknown)}", "code": 400},
                                status_code=400)
        query = list(body["query"])
        overrides = body.get("query_embed_overrides")
        if overrides is not None:  # like _resolve_overrides_for_sequence: one override per placeholder occurrence
            tok = body.get("embed_override_token_id")
            if tok is None:
                return JSONResponse({"object": "error", "message": "embed_override_token_id is required when "
                                     "query_embed_overrides ... are supplied.", "code": 400}, status_code=400)
            pos = [i for i, t in enumerate(query) if t == tok]
            if len(pos) != len(overrides):
                return JSONResponse({"object": "error", "message": f"query contains {len(pos)} occurrences of "
                                     f"embed_override_token_id={tok}, but {len(overrides)} override embeddings were "
                                     "provided.", "code": 400}, status_code=400)
            for i, emb in zip(pos, overrides):  # the "model" sees the override through a hash of its values
                query[i] = int(abs(sum(emb)) * 1000) % vocab
        scores = []
        for item in body["items"]:
            lp = logprobs_after(query + item)
            scores.append([math.exp(lp[t]) for t in body["label_token_ids"]])
        return {"scores": scores, "model": body.get("model", "workbench"), "object": "scoring",
                "usage": {"prompt_tokens": 0, "total_tokens": 0, "completion_tokens": 0}}

    app.state.logprobs_after = logprobs_after
    return app


@pytest.mark.contract_only
async def test_sglang_adapter_contract(ckpt):
    from workbench.engines.sglang_engine import SGLangEngine

    vocab = __import__("json").loads((ckpt / "config.json").read_text())["vocab_size"]
    received: list = []
    app = sglang_app(received, vocab)
    with StandIn(app) as srv:
        eng = SGLangEngine(ckpt, url=srv.url)
        try:
            p = Prompt.of([5, 6, 7, 8])
            # beam search is emulated: one-token /generate requests with top_logprobs_num = beam width
            res = (await eng.beam_search([BeamSearchRequest(p, 3, 2)]))[0]
            assert res.success, res.error
            assert len(res.beams) == 3 and res.beams[0].cum_logprob >= res.beams[-1].cum_logprob
            gen = [b for path, b in received if path == "/generate"]
            assert gen[0]["input_ids"] == [5, 6, 7, 8] and gen[0]["top_logprobs_num"] == 3
            assert gen[0]["return_logprob"] is True and gen[0]["sampling_params"]["max_new_tokens"] == 1
            assert "model" not in gen[0]  # GenerateReqInput has no model field
            # the beam's score is the sum of the stand-in's log-probs along it
            lpa = app.state.logprobs_after
            b = res.beams[0]
            want = lpa([5, 6, 7, 8])[b.token_ids[0]] + lpa([5, 6, 7, 8, b.token_ids[0]])[b.token_ids[1]]
            assert abs(b.cum_logprob - want) < 1e-6

            # constrained: token_ids_logprob carries the trie's allowed children
            received.clear()
            res = (await eng.beam_search([BeamSearchRequest(p, 2, 3, constrained=True)]))[0]
            assert res.success, res.error
            first = [b for path, b in received if path == "/generate"][0]
            layout = eng.info.meta.layout
            lo = layout.item_level_offset(0)
            assert set(first["token_ids_logprob"]) <= set(range(lo, lo + layout.item_codebooks[0]))

            # label scoring -> /v1/score with token-id items, apply_softmax false; log of the probabilities
            received.clear()
            cands = ((10, 11), (12, 13), (14, 15))
            s = (await eng.score([ScoreRequest(p, cands, mode="label", label_token_ids=(3, 4))]))[0]
            assert s.success, s.error
            path, body = received[0]
            assert path == "/v1/score" and body["query"] == [5, 6, 7, 8] and body["items"] == [list(c) for c in cands]
            assert body["label_token_ids"] == [3, 4] and body["apply_softmax"] is False and body["item_first"] is False
            assert abs(s.scores[1][0] - lpa([5, 6, 7, 8, 12, 13])[3]) < 1e-9

            # sequence scoring -> /generate with logprob_start_len = prompt length; sum of input log-probs
            received.clear()
            s = (await eng.score([ScoreRequest(p, cands)]))[0]
            assert s.success, s.error
            want = lpa([5, 6, 7, 8])[10] + lpa([5, 6, 7, 8, 10])[11]
            assert abs(s.scores[0] - want) < 1e-9
            assert all(b["logprob_start_len"] == 4 for _, b in received)

            # soft token, label mode -> ONE /v1/score with the score-time embedding override (sglang 0.5.23
            # ScoringRequest.embed_override_token_id / query_embed_overrides): the projected user vector
            # replaces the <|user|> embedding, the rest of the prompt stays token ids
            ph = layout.placeholder_id
            vec = np.linspace(-1, 1, 16)
            sp = Prompt.of([5, ph, 7], user_vector=vec, placeholder_pos=1)
            received.clear()
            s = (await eng.score([ScoreRequest(sp, cands, mode="label", label_token_ids=(3,))]))[0]
            assert s.success, s.error
            assert len(received) == 1 and received[0][0] == "/v1/score"
            body = received[0][1]
            assert body["query"] == [5, ph, 7] and body["embed_override_token_id"] == ph
            want_row = eng.embedder.embed([ph], vec, 0)[0]  # projector(vec), [hidden]
            assert np.allclose(body["query_embed_overrides"], [want_row.numpy()], atol=1e-6)
            assert len(body["query_embed_overrides"][0]) == eng.info.hidden_size
            ovr = int(abs(float(want_row.sum())) * 1000) % vocab
            assert abs(s.scores[2][0] - lpa([5, ovr, 7, 14, 15])[3]) < 1e-9
            # a different user vector changes the scores (the override is not dropped)
            s2 = (await eng.score([ScoreRequest(Prompt.of([5, ph, 7], user_vector=-vec + 0.3, placeholder_pos=1),
                                                cands, mode="label", label_token_ids=(3,))]))[0]
            assert s2.success and s2.scores != s.scores
            # sequence mode with a soft token stays refused with the reason
            s = (await eng.score([ScoreRequest(sp, cands)]))[0]
            assert not s.success and "unsupported" in s.error
            # generation with a soft token still ships full input_embeds rows
            received.clear()
            res = (await eng.beam_search([BeamSearchRequest(sp, 2, 1)]))[0]
            assert res.success, res.error
            assert all("input_embeds" in b and len(b["input_embeds"]) == 3 for _, b in received)
        finally:
            await eng.close()


# ---- TensorRT-LLM ---------------------------------------------------------------------------------


def trtllm_app(received: list, vocab: int):
    app = FastAPI()
    _models_route(app, "tensorrt_llm")
    allowed = {"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
               "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
               "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty", "early_stopping",
               "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
               "return_context_logits", "detokenize", "add_special_tokens"}

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
    from workbench.engines.trtllm_engine import TRTLLMEngine, _log_softmax

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


# ---- TensorRT-LLM scoring layer (trtllm_scoring_server.py) with a fake LLM object ---------------------
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

    def encode(self, inputs, batch_indexed_model_output=True, **kw):
        self.calls.append((inputs, batch_indexed_model_output, kw))
        outs = [types.SimpleNamespace(logits=self.model.rows(i["prompt_token_ids"]),
                                      prompt_token_ids=i["prompt_token_ids"]) for i in inputs]
        return outs


class FakeGenLLM:
    def __init__(self, model: FakeLogits):
        self.model, self.calls = model, []

    def generate(self, inputs, sampling_params=None, use_tqdm=True):
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
    from workbench.engines.trtllm_scoring_server import _log_softmax_rows

    return _log_softmax_rows(model.rows(ids, vec))


@pytest.mark.contract_only
async def test_trtllm_scoring_layer_contract(ckpt):
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("tensorrt_llm is installed: the real layer is validated by scripts/validate_gpu_engines.sh")
    from workbench.model.checkpoint import read_meta
    from workbench.engines.trtllm_engine import TRTLLMEngine
    from workbench.engines.trtllm_scoring_server import LLMScorer, create_app
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
    """The packed multi-item call (PR #14693 layout) and the clear error without tensorrt_llm."""
    from workbench.engines.trtllm_scoring_server import LLMScorer, ScoreJob, build_scorer, packed_sequence

    seq, delims = packed_sequence([5, 6], [[10, 11], [12]], 99)
    assert seq == [5, 6, 99, 10, 11, 99, 12, 99] and delims == [2, 5, 7]
    vocab = 120
    model = FakeLogits(vocab)
    enc = FakeEncodeLLM(model)
    enc.encode = lambda inp, batch_indexed_model_output=True, **kw: (enc.calls.append((inp, kw)) or
                                                                     types.SimpleNamespace(logits=model.rows(inp["prompt_token_ids"])))
    scorer = LLMScorer(enc, None, FakeAPI, vocab_size=vocab, mis_kwarg="item_delimiter_indices", mis_delimiter=99)
    out = scorer.score(ScoreJob((5, 6), ((10, 11), (12,)), "label", (3,)))
    assert enc.calls[0] == ({"prompt_token_ids": seq}, {"item_delimiter_indices": delims})
    lp = _layer_logprobs(model, seq)
    assert out == [[float(lp[4, 3])], [float(lp[6, 3])]]  # read at each item's last token
    if importlib.util.find_spec("tensorrt_llm") is None:
        with pytest.raises(EngineUnavailable, match="tensorrt_llm"):
            build_scorer(ckpt)


def test_launcher_specs_for_pinned_flags(ckpt, monkeypatch):
    """sglang 0.5.23 takes --enable-mis (no --multi-item-scoring-delimiter); the TRT layer runs from the trtllm env."""
    import sys

    from workbench.engines import launcher

    monkeypatch.setenv("WORKBENCH_SGLANG_PYTHON", sys.executable)
    monkeypatch.setenv("WORKBENCH_TRTLLM_PYTHON", sys.executable)
    argv = launcher.sglang_spec(ckpt, enable_mis=True).argv
    assert "--enable-mis" in argv and argv[argv.index("--attention-backend") + 1] == "flashinfer"
    assert "--multi-item-scoring-delimiter" not in argv
    spec = launcher.trtllm_scoring_spec(ckpt, port=8123, mis_kwarg="k")
    assert spec.argv[:3] == (sys.executable, "-m", "workbench.engines.trtllm_scoring_server")
    assert spec.argv[spec.argv.index("--checkpoint") + 1] == str(ckpt.resolve()) and spec.url.endswith(":8123")
    assert spec.argv[spec.argv.index("--mis-kwarg") + 1] == "k"


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
