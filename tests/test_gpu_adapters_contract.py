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

import math
import threading
import time

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

    @app.post("/v1/score")
    async def score(req: Request):
        body = await req.json()
        received.append(("/v1/score", body))
        scores = []
        for item in body["items"]:
            lp = logprobs_after(body["query"] + item)
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

            # soft token -> input_embeds (rows of floats), label mode by fan-out, sequence mode refused
            ph = layout.placeholder_id
            sp = Prompt.of([5, ph, 7], user_vector=np.ones(16), placeholder_pos=1)
            received.clear()
            s = (await eng.score([ScoreRequest(sp, cands, mode="label", label_token_ids=(3,))]))[0]
            assert s.success, s.error
            assert all("input_embeds" in b and len(b["input_embeds"]) == 5 for _, b in received)
            assert eng.transport_stats().requests == 3
            s = (await eng.score([ScoreRequest(sp, cands)]))[0]
            assert not s.success and "unsupported" in s.error
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
