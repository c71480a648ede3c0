"""`workbench serve`: an in-process engine behind HTTP, in the shapes the external engines speak.

So that load tests measure every engine the same way (over HTTP, from another process), the
workbench's own engine gets a server too:

- `POST /v1/completions`: OpenAI completions shape as vLLM extends it (`prompt` as token ids,
  `use_beam_search`, `n` = beam width, `max_tokens`), plus `user_vector`, `placeholder_pos`,
  `constrained`, `banned_items`. Every beam comes back as a choice (best first) with its
  `token_ids` and `cum_logprob`.
- `POST /v1/score`: SGLang `/v1/score` shape (`query` token ids, `items` token-id lists,
  `label_token_ids`, `apply_softmax`), plus `mode` ("label" | "sequence") and the soft-token
  fields. `scores` holds per item the label log-probs (or probabilities with `apply_softmax`),
  or one summed log-prob in mode "sequence".
- `GET /health`, `GET /v1/capabilities`.

Bad input is a 4xx with a message (400 for requests the engine rejects, 422 for malformed JSON,
413 over the body-size limit). Binds 127.0.0.1 unless told otherwise; uvicorn handles SIGINT /
SIGTERM by finishing in-flight requests, then the engine is closed.
"""

from __future__ import annotations

import math
import time
import uuid
from contextlib import asynccontextmanager
from typing import Literal

from pydantic import BaseModel, Field

from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest

MAX_BODY_BYTES = 8 * 1024 * 1024


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: list[int] | list[list[int]] = Field(..., description="token ids (or a list of token-id prompts)")
    max_tokens: int = Field(16, ge=1)
    n: int = Field(1, ge=1, description="beam width: every beam is returned")
    use_beam_search: bool = False
    temperature: float | None = None
    user_vector: list[float] | None = None
    placeholder_pos: int | None = None
    constrained: bool = False
    banned_items: list[int] = Field(default_factory=list)


class ScoreBody(BaseModel):
    model: str | None = None
    query: list[int] = Field(..., description="prompt token ids")
    items: list[list[int]] = Field(..., description="candidate token-id lists")
    label_token_ids: list[int] = Field(default_factory=list)
    mode: Literal["label", "sequence"] | None = None  # default: label when label_token_ids are given
    apply_softmax: bool = False
    item_first: bool = False
    user_vector: list[float] | None = None
    placeholder_pos: int | None = None


def _error(status: int, message: str, kind: str = "invalid_request_error"):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def create_app(engine, model_name: str = "workbench", max_body_bytes: int = MAX_BODY_BYTES, close_engine: bool = True):
    """A FastAPI app serving `engine` (any object following the Engine protocol)."""
    from fastapi import FastAPI, Request

    @asynccontextmanager
    async def lifespan(app):
        yield
        if close_engine:
            await engine.close()

    app = FastAPI(title="workbench engine server", lifespan=lifespan)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        size = request.headers.get("content-length")
        if size is not None and int(size) > max_body_bytes:
            return _error(413, f"request body of {size} bytes exceeds the limit of {max_body_bytes}; split the request")
        return await call_next(request)

    @app.get("/health")
    async def health():
        return {"status": "ok", "engine": engine.name, "model": model_name}

    @app.get("/v1/capabilities")
    async def capabilities():
        caps = engine.capabilities()
        return {"engine": caps.engine, "features": {k: {"status": v.status.value, "reason": v.reason} for k, v in caps.features.items()}}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        if not body.use_beam_search and body.n != 1:
            return _error(400, "this server runs beam search only: set use_beam_search=true (n is the beam width)")
        prompts = body.prompt if body.prompt and isinstance(body.prompt[0], list) else [body.prompt]
        if body.user_vector is not None and len(prompts) != 1:
            return _error(400, "user_vector applies to one prompt; send one prompt per request")
        try:
            reqs = [
                BeamSearchRequest(Prompt.of(p, body.user_vector, body.placeholder_pos), beam_width=body.n,
                                  max_new_tokens=body.max_tokens, constrained=body.constrained,
                                  banned_items=tuple(body.banned_items))
                for p in prompts
            ]
        except (TypeError, ValueError) as e:
            return _error(400, f"bad request: {e}")
        results = await engine.beam_search(reqs)
        failed = [r for r in results if not r.success]
        if failed:
            return _error(400, failed[0].error or "request failed")
        choices, gen = [], 0
        for r in results:
            for b in r.beams:
                choices.append({"index": len(choices), "text": "", "token_ids": b.token_ids, "cum_logprob": b.cum_logprob,
                                "logprobs": None, "finish_reason": "length"})
                gen += len(b.token_ids)
        ptoks = sum(r.prompt_tokens for r in results)
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": int(time.time()),
            "model": body.model or model_name, "choices": choices,
            "usage": {"prompt_tokens": ptoks, "completion_tokens": gen, "total_tokens": ptoks + gen},
        }

    @app.post("/v1/score")
    async def score(body: ScoreBody):
        if body.item_first:
            return _error(400, "item_first=true is not supported: the query (user prompt) is the shared prefix")
        mode = body.mode or ("label" if body.label_token_ids else "sequence")
        try:
            req = ScoreRequest(Prompt.of(body.query, body.user_vector, body.placeholder_pos),
                               tuple(tuple(int(t) for t in it) for it in body.items), mode=mode,
                               label_token_ids=tuple(body.label_token_ids))
        except (TypeError, ValueError) as e:
            return _error(400, f"bad request: {e}")
        (res,) = await engine.score([req])
        if not res.success:
            return _error(400, res.error or "request failed")
        scores = res.scores
        if mode == "label" and body.apply_softmax:
            scores = [_softmax(s) for s in scores]
        return {"object": "scoring", "model": body.model or model_name, "scores": scores, "mode": mode,
                "usage": {"prompt_tokens": res.prompt_tokens, "item_tokens": sum(len(i) for i in body.items)}}

    return app


def _softmax(logps: list[float]) -> list[float]:
    m = max(logps)
    e = [math.exp(x - m) for x in logps]
    z = sum(e)
    return [x / z for x in e]


def serve(checkpoint, engine: str = "torch", host: str = "127.0.0.1", port: int = 8100, dtype: str = "float32",
          **options) -> None:
    """Load `checkpoint` into `engine` and serve it until SIGINT/SIGTERM (then close it cleanly)."""
    import uvicorn

    from workbench.model.checkpoint import read_meta
    from workbench.engines.registry import create_engine

    meta = read_meta(checkpoint)
    eng = create_engine(engine, checkpoint=checkpoint, dtype=dtype, **options)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding {host}: the server has no authentication", flush=True)
    app = create_app(eng, model_name=f"{meta.backbone}:{meta.method}")
    # keep-alive 30 s (uvicorn's default is 5): clients under load reuse connections instead of racing the
    # server's close of an idle one (see http_common.KEEPALIVE_EXPIRY_S, which expires them first anyway)
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=30, timeout_keep_alive=30)
