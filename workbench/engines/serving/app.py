"""The app of `workbench serve`: an in-process engine behind HTTP, in the shapes the external engines speak.

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

Every answer that is not a 200 has one shape, `{"error": {"message", "type", "code"}}` (OpenAI's),
and an input problem is never a 500:

- 400: a request the engine refuses (`base.validate_*`, so every engine refuses the same): empty or
  over-long prompt, ids outside the vocabulary, beam width or candidate count over the engine's
  limits, a `<|user|>` placeholder inside a score candidate, `placeholder_pos` without a
  `user_vector`, a user vector of the wrong size, with NaN/inf, with values beyond what the engine's
  dtype holds (`Limits.max_abs_user_value`, from `torch.finfo`) or whose projection overflows that
  dtype; `n != 1` without `use_beam_search`; `item_first`. Also any result that still holds NaN/inf
  (JSON cannot carry it, and valid input on a healthy model gives finite log-probs).
- 422: a body that is not JSON or does not fit the schema. Token ids (`prompt`, `query`, `items`,
  `label_token_ids`, `banned_items`) and `n`, `max_tokens`, `placeholder_pos` are strict integers:
  `true`, `1.0` and `"1"` are refused, not read as 1; a user vector takes numbers only. The message
  names the field and why ("prompt.0: Input should be a valid integer (got True)") for the first 3
  errors and counts the rest; inputs appear as short excerpts only, and every message is capped at
  1,000 characters, so a megabyte request never gets a megabyte answer. Unknown fields are ignored.
- 413: a body over `max_body_bytes` (8 MiB by default), however it is sent: a `content-length` over
  the limit is refused before the body is read; a chunked body is counted as it streams in and
  refused once the count passes the limit (the connection is closed, the rest never read). A
  malformed `content-length` is a 400 (uvicorn's HTTP parser refuses most itself, with a plain-text
  400, before the app sees them).
- 404 / 405: unknown route or method.

Binds 127.0.0.1 unless told otherwise; uvicorn handles SIGINT / SIGTERM by finishing in-flight
requests, then the engine is closed.
"""


from __future__ import annotations

from contextlib import asynccontextmanager

from workbench.engines.serving import openai_api, sglang_api
from workbench.engines.serving.body_limit import MAX_BODY_BYTES, BodyLimit
from workbench.engines.serving.errors import cap, error_response, validation_message


def create_app(engine, model_name: str = "workbench", max_body_bytes: int = MAX_BODY_BYTES, close_engine: bool = True):
    """A FastAPI app serving `engine` (any object following the Engine protocol)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @asynccontextmanager
    async def lifespan(app):
        yield
        if close_engine:
            await engine.close()

    app = FastAPI(title="workbench engine server", lifespan=lifespan)
    app.state.engine, app.state.model_name = engine, model_name  # what the routers serve
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError):
        return error_response(422, validation_message(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def httperror_response(request: Request, exc: StarletteHTTPException):
        # 404 / 405 / 413 / FastAPI's 400 for an unreadable body: the same shape as every other error
        where = f"{request.method} {cap(request.url.path, 100)}"
        message = str(exc.detail)
        if exc.status_code == 404:
            message = (f"no route {where}; this server has POST /v1/completions, POST /v1/score, GET /health, "
                       "GET /v1/capabilities")
        elif exc.status_code == 405:
            message = f"method not allowed: {where}"
        elif exc.status_code == 400:  # FastAPI could not decode the body
            message = f"{exc.detail}: it is not UTF-8 JSON, or nested too deeply; send one JSON object"
        return error_response(exc.status_code, message, headers=exc.headers)

    @app.exception_handler(Exception)
    async def servererror_response(request: Request, exc: Exception):
        # a bug, not an input problem (those are 4xx above): the shape still holds, the message names the type
        return error_response(500, f"internal error ({type(exc).__name__}); the server log has the traceback", "server_error")

    @app.get("/health")
    async def health():
        return {"status": "ok", "engine": engine.name, "model": model_name}

    @app.get("/v1/capabilities")
    async def capabilities():
        caps = engine.capabilities()
        return {"engine": caps.engine, "features": {k: {"status": v.status.value, "reason": v.reason} for k, v in caps.features.items()}}

    app.include_router(openai_api.router)
    app.include_router(sglang_api.router)
    return app
