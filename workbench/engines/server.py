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

import math
import re
import reprlib
import time
import uuid
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, Literal, Sequence

from pydantic import BaseModel, Discriminator, Field, StrictFloat, StrictInt, Tag

from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_MESSAGE_CHARS = 1000  # an error message never grows with the input (no echo of a megabyte prompt)
MAX_LISTED_ERRORS = 3  # validation errors spelled out in a 422 message; the rest are counted

# Strict types: JSON true/false, 1.0 or "1" are not token ids (pydantic's lax mode would take them as 1, 0,
# 1, 1). fail_fast: a list stops at its first bad element, so a megabyte of bad ids costs one error, not a
# million (collecting and serialising those took ~40 s and a 137 MB answer).
TokenIds = Annotated[list[StrictInt], Field(fail_fast=True)]
UserVector = Annotated[list[StrictFloat], Field(fail_fast=True)]
_ONE, _MANY = "token-id list", "list of token-id lists"  # the prompt's two shapes; stripped from error paths


def _prompt_shape(v) -> str:
    """Which shape a `prompt` is, decided by its first element, so a bad one reports that shape's error only."""
    return _MANY if isinstance(v, list) and v and isinstance(v[0], list) else _ONE


PromptIds = Annotated[
    Annotated[TokenIds, Tag(_ONE)] | Annotated[list[TokenIds], Field(fail_fast=True), Tag(_MANY)],
    Discriminator(_prompt_shape),
]


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: PromptIds = Field(..., description="token ids (or a list of token-id prompts)")
    max_tokens: StrictInt = Field(16, ge=1)
    n: StrictInt = Field(1, ge=1, description="beam width: every beam is returned")
    use_beam_search: bool = False
    temperature: float | None = None
    user_vector: UserVector | None = None
    placeholder_pos: StrictInt | None = None
    constrained: bool = False
    banned_items: TokenIds = Field(default_factory=list)


class ScoreBody(BaseModel):
    model: str | None = None
    query: TokenIds = Field(..., description="prompt token ids")
    items: list[TokenIds] = Field(..., description="candidate token-id lists", fail_fast=True)
    label_token_ids: TokenIds = Field(default_factory=list)
    mode: Literal["label", "sequence"] | None = None  # default: label when label_token_ids are given
    apply_softmax: bool = False
    item_first: bool = False
    user_vector: UserVector | None = None
    placeholder_pos: StrictInt | None = None


def _cap(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "…"


def _error(status: int, message: str, kind: str = "invalid_request_error", headers: dict | None = None):
    """The one error shape of every non-200 answer: {"error": {"message", "type", "code"}} (OpenAI's)."""
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, headers=headers,
                        content={"error": {"message": _cap(message), "type": kind, "code": status}})


def _excerpt(value) -> str:
    """A short repr of `value` (at most ~80 characters, whatever its size): lists cut after 4 elements."""
    r = reprlib.Repr()  # Python 3.11: no keyword arguments yet
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxstring, r.maxother, r.maxlong = 2, 4, 4, 4, 24, 24, 24
    return _cap(r.repr(value), 80)


def validation_message(errors: Sequence[dict]) -> str:
    """'prompt.0: Input should be a valid integer (got True)' for the first few of pydantic's errors.

    The path is the field (the prompt's shape tag left out, `body` dropped), the input only a short
    excerpt: pydantic's own answer echoes every bad value, megabytes for a megabyte request.
    """
    parts = []
    for e in errors[:MAX_LISTED_ERRORS]:
        loc = [str(x) for x in e.get("loc", ()) if x not in (_ONE, _MANY)]
        if loc[:1] == ["body"]:
            loc = loc[1:]
        if e.get("type") == "json_invalid":
            at = f" at character {loc[0]}" if loc else ""
            parts.append(f"body is not valid JSON{at}: {(e.get('ctx') or {}).get('error', e.get('msg'))}")
            continue
        text = f"{'.'.join(loc) or 'body'}: {e.get('msg', 'invalid value')}"
        if "input" in e and e.get("type") != "missing":
            text += f" (got {_excerpt(e['input'])})"
        parts.append(text)
    more = len(errors) - len(parts)
    return _cap("; ".join(parts) + (f" (and {more} more)" if more > 0 else "") or "invalid request")


def _declared_length(values: list[bytes]) -> int:
    """The request's Content-Length (one or more equal headers, or a comma list of equal values, as RFC 9110
    allows); ValueError when it is not a plain decimal number."""
    sizes = {v.strip() for raw in values for v in raw.decode("latin-1").split(",")}
    if len(sizes) != 1 or not re.fullmatch(r"[0-9]{1,19}", next(iter(sizes))):
        raise ValueError(f"malformed content-length {b', '.join(values)[:40]!r}")
    return int(sizes.pop())


def _body_too_large(limit: int):
    """The 413 raised from inside the body read; an HTTPException so FastAPI passes it on unchanged."""
    from starlette.exceptions import HTTPException

    return HTTPException(413, f"request body exceeds the limit of {limit} bytes; split the request",
                         headers={"connection": "close"})


class BodyLimit:
    """Pure ASGI middleware: every request body is bounded, however it is framed.

    A `content-length` over the limit is refused (413) before a byte of the body is read, a malformed one
    is a 400 (uvicorn's HTTP parser already refuses most with its own plain-text 400). A body without one
    (chunked transfer encoding) is counted as it streams in: the read that passes the limit raises a 413,
    the answer closes the connection, and the rest is never read, let alone buffered.
    """

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = int(max_bytes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = [v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"]
        if declared:
            try:
                size = _declared_length(declared)
            except ValueError as e:
                await _error(400, f"{e}; send the body's size in bytes, or no content-length (chunked)",
                             headers={"connection": "close"})(scope, receive, send)
                return
            if size > self.max_bytes:
                await _error(413, f"request body of {size} bytes exceeds the limit of {self.max_bytes}; split the "
                             "request", headers={"connection": "close"})(scope, receive, send)
                return
        received = 0
        started = False
        overflow = None

        async def counted_receive():
            nonlocal received, overflow
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    overflow = _body_too_large(self.max_bytes)
                    raise overflow
            return message

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except Exception as e:  # our 413, where the app let it through (FastAPI answers it via the handler)
            if e is not overflow or started:
                raise
            await _error(413, str(e.detail), headers=e.headers)(scope, receive, send)


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
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError):
        return _error(422, validation_message(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # 404 / 405 / 413 / FastAPI's 400 for an unreadable body: the same shape as every other error
        where = f"{request.method} {_cap(request.url.path, 100)}"
        message = str(exc.detail)
        if exc.status_code == 404:
            message = (f"no route {where}; this server has POST /v1/completions, POST /v1/score, GET /health, "
                       "GET /v1/capabilities")
        elif exc.status_code == 405:
            message = f"method not allowed: {where}"
        elif exc.status_code == 400:  # FastAPI could not decode the body
            message = f"{exc.detail}: it is not UTF-8 JSON, or nested too deeply; send one JSON object"
        return _error(exc.status_code, message, headers=exc.headers)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception):
        # a bug, not an input problem (those are 4xx above): the shape still holds, the message names the type
        return _error(500, f"internal error ({type(exc).__name__}); the server log has the traceback", "server_error")

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
        if not all(math.isfinite(b.cum_logprob) for r in results for b in r.beams):
            return _error(400, NON_FINITE.format(what="log-probs"))
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
        if not _all_finite(scores):
            return _error(400, NON_FINITE.format(what="scores"))
        if mode == "label" and body.apply_softmax:
            scores = [_softmax(s) for s in scores]
        return {"object": "scoring", "model": body.model or model_name, "scores": scores, "mode": mode,
                "usage": {"prompt_tokens": res.prompt_tokens, "item_tokens": sum(len(i) for i in body.items)}}

    return app


# The last guard: engines catch what they can (NaN/inf vectors, dtype range, projector overflow), but a
# result that still holds NaN/inf came from the input (a healthy model on valid input gives finite log-probs);
# JSON cannot carry it either, so it is a 400, never a 500 from the serialiser.
NON_FINITE = ("the engine's {what} for this request are not finite (NaN or inf): the input drives the model beyond "
              "what its dtype can hold, most likely through the user vector's scale; normalize the vector (e.g. to "
              "unit L2 norm) or fold the user in again")


def _all_finite(values) -> bool:
    """True when every number in `values` (a float, or nested lists of them) is finite."""
    if isinstance(values, (list, tuple)):
        return all(_all_finite(v) for v in values)
    return math.isfinite(values)


def _softmax(logps: list[float]) -> list[float]:
    m = max(logps)
    e = [math.exp(x - m) for x in logps]
    z = sum(e)
    return [x / z for x in e]


def check_port(host: str, port: int) -> None:
    """Raise UsageError unless `host:port` can be bound now: checked before the model loads (which takes
    a while) instead of uvicorn failing after it. Port 0 is refused: the OS would pick a port that the
    clients (and the log line they read) do not know. SO_REUSEADDR as uvicorn sets it, so a port that
    only has connections in TIME_WAIT passes, and one with a live listener does not."""
    import errno
    import socket

    from workbench.errors import UsageError

    if port == 0:
        raise UsageError("port 0 (a port the OS picks) is refused: clients could not know it; use --port 1-65535")
    if not 1 <= port <= 65535:
        raise UsageError(f"port {port} is not a TCP port; use --port 1-65535 (default 8100)")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise UsageError(f"cannot bind --host {host}: {e.strerror}; give an address of this machine "
                         "(127.0.0.1 for local only, 0.0.0.0 for every interface)") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} on {host} is already in use (another server?); stop it or choose "
                                 "another port with --port") from None
            why = "ports below 1024 need root; " if e.errno == errno.EACCES and port < 1024 else ""
            raise UsageError(f"cannot bind {host}:{port}: {e.strerror}; {why}choose another --host/--port") from None


def serve(checkpoint, engine: str = "torch", host: str = "127.0.0.1", port: int = 8100, dtype: str = "float32",
          **options) -> None:
    """Load `checkpoint` into `engine` and serve it until SIGINT/SIGTERM (then close it cleanly).

    The cheap checks run first (a free port, a checkpoint folder with safetensors weights), so a
    mistake is reported in a second instead of after the model has loaded."""
    from workbench.model.checkpoint import read_meta, require_safetensors

    check_port(host, port)
    meta = read_meta(checkpoint)
    require_safetensors(checkpoint)
    import uvicorn

    from workbench.engines.registry import create_engine

    eng = create_engine(engine, checkpoint=checkpoint, dtype=dtype, **options)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding {host}: the server has no authentication", flush=True)
    app = create_app(eng, model_name=f"{meta.backbone}:{meta.method}")
    # keep-alive 30 s (uvicorn's default is 5): clients under load reuse connections instead of racing the
    # server's close of an idle one (see http_common.KEEPALIVE_EXPIRY_S, which expires them first anyway)
    config = uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=30,
                            timeout_keep_alive=30)
    server = uvicorn.Server(config)  # not uvicorn.run: it swallows the interrupt the CLI turns into 128 + signal
    with _hangup_as_terminate():
        server.run()
    if not server.started:
        raise RuntimeError(f"the server on {host}:{port} did not start; see the log lines above")


@contextmanager
def _hangup_as_terminate():
    """SIGHUP shuts the server down like SIGTERM: uvicorn handles only SIGINT and SIGTERM (in-flight
    requests finish, the lifespan closes the engine), then re-raises the signal it caught, which the
    CLI turns into its exit status (`signals.py`); a hang-up still exits 128 + SIGHUP."""
    import os
    import signal
    import threading

    from workbench import signals

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hung_up: list[int] = []

    def on_hup(signum, frame) -> None:
        hung_up.append(signum)
        os.kill(os.getpid(), signal.SIGTERM)

    old = signal.signal(signal.SIGHUP, on_hup)
    try:
        yield
    except signals.Terminated:
        if hung_up:
            raise signals.Terminated(signal.SIGHUP) from None
        raise
    finally:
        signal.signal(signal.SIGHUP, old)
