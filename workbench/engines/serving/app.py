"""The app of `workbench serve`: an in-process engine behind HTTP, in the shapes the external engines speak.

So that load tests measure every engine the same way (over HTTP, from another process), the
workbench's own engine gets a server too:

- `POST /v1/completions`, `GET /v1/models`: OpenAI completions as vLLM's server takes them (text or
  token-id prompts, beam search with `use_beam_search` / `n` / `best_of`, greedy otherwise, `logprobs`,
  `echo`, SSE `stream`), plus `user_vector`, `placeholder_pos`, `constrained`, `banned_items`; every
  beam a choice (best first) with its `text`, `token_ids` and `cum_logprob`; any parameter it cannot
  honour is a 400 naming it (openai_api.py).
- `POST /v1/score`: SGLang 0.5.23's scoring request and response, field for field (label scores,
  `apply_softmax`, `item_first`, text or ids, `usage`), plus the soft-token fields;
  `POST /v1/score_sequences`: the workbench's own summed log-prob per item (sglang_api.py).
- `GET|HEAD /health` (liveness), `GET|HEAD /ready` (readiness: 503 until a warm-up request has run
  through the engine), `GET /health_generate` (SGLang's probe): health.py. `GET /metrics`
  (Prometheus, the app's own registry): metrics.py. `GET /v1/capabilities`.

Every answer that is not a 200 has one shape, `{"error": {"message", "type", "code"}}` (OpenAI's),
and an input problem is never a 500:

- 400: a request the engine refuses (`base.validate_*`, so every engine refuses the same): empty or
  over-long prompt, ids outside the vocabulary, beam width or candidate count over the engine's
  limits, a `<|user|>` placeholder inside a score candidate, `placeholder_pos` without a
  `user_vector`, a user vector of the wrong size, with NaN/inf, with values beyond what the engine's
  dtype holds (`Limits.max_abs_user_value`, from `torch.finfo`) or whose projection overflows that
  dtype; a parameter that cannot be honoured (sampling, top-k log-probs, unknown fields). Also any result that still holds NaN/inf
  (JSON cannot carry it, and valid input on a healthy model gives finite log-probs).
- 422: a body that is not JSON or does not fit the schema. Token ids (`prompt`, `query`, `items`,
  `label_token_ids`, `banned_items`) and `n`, `max_tokens`, `placeholder_pos` are strict integers:
  `true`, `1.0` and `"1"` are refused, not read as 1; a user vector takes numbers only. The message
  names the field and why ("prompt.0: Input should be a valid integer (got True)") for the first 3
  errors and counts the rest; inputs appear as short excerpts only, and every message is capped at
  1,000 characters, so a megabyte request never gets a megabyte answer.
- 413: a body over `max_body_bytes` (8 MiB by default), however it is sent: a `content-length` over
  the limit is refused before the body is read; a chunked body is counted as it streams in and
  refused once the count passes the limit (the connection is closed, the rest never read). A
  malformed `content-length` is a 400 (uvicorn's HTTP parser refuses most itself, with a plain-text
  400, before the app sees them).
- 404 / 405: unknown route or method; 404 `model_not_found` for a model name this server does not serve.

Binds 127.0.0.1 unless told otherwise; SIGINT / SIGTERM / SIGHUP finish in-flight requests, then the
engine is closed (serve.py).
"""


from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from workbench.engines.serving import health, metrics, openai_api, sglang_api
from workbench.engines.serving.body_limit import MAX_BODY_BYTES, BodyLimit
from workbench.engines.serving.errors import cap, error_response, validation_message


def create_app(engine, model_name: str = "workbench", max_body_bytes: int = MAX_BODY_BYTES, close_engine: bool = True):
    """A FastAPI app serving `engine` (any object following the Engine protocol)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @asynccontextmanager
    async def lifespan(app):
        # the model is loaded (the engine exists); /ready flips once this warm-up has run through it
        warm = asyncio.create_task(health.warm_up(engine, app.state.readiness))
        yield
        warm.cancel()  # a no-op once done; its engine calls are shielded
        if close_engine:
            await engine.close()

    app = FastAPI(title="workbench engine server", lifespan=lifespan)
    app.state.engine, app.state.model_name = engine, model_name  # what the routers serve
    app.state.tokenizer = getattr(getattr(engine, "checkpoint", None), "tokenizer", None)  # text in /v1/score
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.state.readiness = health.Readiness()
    metrics.install(app, engine)  # added after BodyLimit: outside it, so its 413s are counted too

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError):
        return error_response(422, validation_message(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def httperror_response(request: Request, exc: StarletteHTTPException):
        # 404 / 405 / 413 / FastAPI's 400 for an unreadable body: the same shape as every other error
        where = f"{request.method} {cap(request.url.path, 100)}"
        message = str(exc.detail)
        if exc.status_code == 404:
            message = (f"no route {where}; this server has POST /v1/completions, GET /v1/models, POST /v1/score, "
                       "POST /v1/score_sequences, GET /health, GET /ready, GET /metrics, GET /v1/capabilities")
        elif exc.status_code == 405:
            message = f"method not allowed: {where}"
        elif exc.status_code == 400:  # FastAPI could not decode the body
            message = f"{exc.detail}: it is not UTF-8 JSON, or nested too deeply; send one JSON object"
        return error_response(exc.status_code, message, headers=exc.headers)

    @app.exception_handler(Exception)
    async def servererror_response(request: Request, exc: Exception):
        # a bug, not an input problem (those are 4xx above): the shape still holds, the message names the type
        return error_response(500, f"internal error ({type(exc).__name__}); the server log has the traceback", "server_error")

    @app.get("/v1/capabilities")
    async def capabilities():
        caps = engine.capabilities()
        return {"engine": caps.engine, "features": {k: {"status": v.status.value, "reason": v.reason} for k, v in caps.features.items()}}

    app.include_router(health.router)
    app.include_router(openai_api.router)
    app.include_router(sglang_api.router)
    return app
