"""Prometheus metrics of `workbench serve`: `GET /metrics`, from a registry of the app's own.

HTTP, measured by a pure ASGI middleware outside every other one (so the body limit's 413s and the
error handlers' 4xx/5xx are counted like any answer):

    workbench_http_requests_total{method,route,status}          counter
    workbench_http_request_duration_seconds{method,route}       histogram: request in -> last byte handed on
    workbench_prompt_tokens_total{route}                        counter  } the `usage` of each 200 JSON
    workbench_generation_tokens_total{route}                    counter  } answer (prompt / completion_tokens)

`route` is the matched route's path, or "unmatched" (a scanner's random URLs must not make a series
each); an unknown method is "other". The token counters read the usage the answer itself carries, so
they equal what clients were told by construction (a single-message JSON body; a streamed one is not
read).

The engine, where it offers the hooks (the torch engine does; others simply do not export these):

    workbench_engine_requests_waiting                           gauge: `engine.queue_depth()` at scrape
    workbench_engine_batch_requests                             histogram: requests per forward
    workbench_engine_batch_tokens                               histogram: token rows per forward

(`engine.on_forward` is set to feed the last two: the app created last for an engine gets its
batches), plus `process_*` (CPU seconds, resident memory, open files: prometheus_client's standard
process collector, under the names dashboards expect).

Why a registry per app: prometheus_client's global registry refuses a second metric of one name, so
two apps in one process (the tests, in-process benchmarks) would clash, and each would export the
other's counts.

Overhead (measured while writing this on the shared 2-core VM, in process over httpx's ASGI transport):
the bookkeeping per request is ~4 us, ~11 us with the usage read from a 200 answer (the same for a
1,000-item score answer: only the bytes after its last `"usage"` key are parsed; a full parse of that
answer costs ~580 us); `GET /health` went from a median of ~160 us to ~170 us, the smallest completion
takes ~2 ms (its run-to-run noise here is larger than the difference); the engine hook costs ~2.5 us
per forward; a scrape renders in ~1-2 ms.
"""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

router = APIRouter()

# e2e latency from sub-millisecond probes to long beam searches on a loaded CPU box
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_REQUEST_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
BATCH_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 65536)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
UNMATCHED = "unmatched"


class ServerMetrics:
    """The metrics of one app (see the module docstring), in `self.registry`."""

    def __init__(self, engine) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

        self.registry = reg = CollectorRegistry()
        self.requests = Counter("workbench_http_requests", "HTTP requests answered, by method, route and status",
                                ["method", "route", "status"], registry=reg)
        self.latency = Histogram("workbench_http_request_duration_seconds",
                                 "End-to-end latency of HTTP requests (request in to last byte handed on), by route",
                                 ["method", "route"], buckets=LATENCY_BUCKETS_S, registry=reg)
        self.prompt_tokens = Counter("workbench_prompt_tokens", "Prompt tokens reported in the usage of 200 answers",
                                     ["route"], registry=reg)
        self.generation_tokens = Counter("workbench_generation_tokens",
                                         "Generated tokens (usage.completion_tokens) reported in 200 answers",
                                         ["route"], registry=reg)
        ProcessCollector(registry=reg)
        self._routes: frozenset[str] | None = None
        if callable(getattr(engine, "queue_depth", None)):
            Gauge("workbench_engine_requests_waiting", "Requests queued in the engine's scheduler, not yet in a forward",
                  registry=reg).set_function(engine.queue_depth)
        if hasattr(engine, "on_forward"):
            self.batch_requests = Histogram("workbench_engine_batch_requests", "Requests in each engine forward",
                                            buckets=BATCH_REQUEST_BUCKETS, registry=reg)
            self.batch_tokens = Histogram("workbench_engine_batch_tokens", "Token rows in each engine forward",
                                          buckets=BATCH_TOKEN_BUCKETS, registry=reg)
            engine.on_forward = self.observe_forward

    def observe_forward(self, requests: int, rows: int) -> None:
        """The engine's `on_forward` hook (called on its worker thread; prometheus_client is thread-safe)."""
        self.batch_requests.observe(requests)
        self.batch_tokens.observe(rows)

    def route_of(self, scope) -> str:
        """The route label of an answered request: the path (template) of the route FastAPI matched (also for
        a 405), else the request's path where a route has it (a 413 answered before routing, Starlette's
        own routes), else UNMATCHED: the label's values stay bounded by the app's routes."""
        path = getattr(scope.get("route"), "path", None)
        if isinstance(path, str):
            return path
        if self._routes is None:  # every route is added before the first request
            self._routes = frozenset(_route_paths(getattr(scope.get("app"), "routes", ())))
        path = scope.get("path", "")
        return path if path in self._routes else UNMATCHED

    def record(self, method: str, route: str, status: int, seconds: float, body: bytes | None) -> None:
        """Count one answered request; `body` (a 200 answer's JSON, else None) adds its usage's tokens."""
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)
        usage = _usage(body) if body else None
        if usage:
            self.prompt_tokens.labels(route).inc(_count(usage.get("prompt_tokens")))
            self.generation_tokens.labels(route).inc(_count(usage.get("completion_tokens")))


def _route_paths(routes) -> set[str]:
    """The paths of `routes`, included routers' routes too (FastAPI 0.165 keeps an included router as one
    entry holding `original_router`; earlier versions copied its routes in)."""
    out: set[str] = set()
    for r in routes:
        if isinstance(getattr(r, "path", None), str):
            out.add(r.path)
        inner = getattr(getattr(r, "original_router", None), "routes", None)
        if inner:
            out |= _route_paths(inner)
    return out


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _usage(body: bytes) -> dict | None:
    """The top-level `usage` object of a JSON answer, or None. Read from its last `"usage":` key (the
    answers put it at the top level, after the choices and scores) without parsing the rest; a full
    parse only when that reading fails."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return None
    usage, rest = None, body[at + 7 :].lstrip()
    if rest[:1] == b":":
        try:
            usage, _ = json.JSONDecoder().raw_decode(rest[1:].lstrip().decode())
        except (ValueError, UnicodeDecodeError):
            pass
    if not isinstance(usage, dict) or "prompt_tokens" not in usage:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
        usage = doc.get("usage") if isinstance(doc, dict) else None
    return usage if isinstance(usage, dict) else None


class MetricsMiddleware:
    """Pure ASGI: time and count every HTTP request (see ServerMetrics.record). Recorded when the last body
    message is handed to the server, before it is sent, so a client that has its answer finds it counted
    in its next scrape; a request whose app raised before answering counts as the 500 the server sends."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        method = scope["method"] if scope["method"] in METHODS else "other"
        status, recorded, chunked = 500, False, False

        async def counted_send(message) -> None:
            nonlocal status, recorded, chunked
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not recorded:
                if message.get("more_body", False):
                    chunked = True
                else:
                    recorded = True
                    body = message.get("body", b"") if status == 200 and method == "POST" and not chunked else None
                    self.metrics.record(method, self.metrics.route_of(scope), status, time.perf_counter() - t0, body)
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        finally:  # the app raised (the server answers 500) or returned without an answer (uvicorn's 500)
            if not recorded:
                self.metrics.record(method, self.metrics.route_of(scope), status, time.perf_counter() - t0, None)


def install(app, engine) -> ServerMetrics:
    """Give `app` its metrics: the middleware (outermost of those added so far: add it last) and GET /metrics."""
    metrics = ServerMetrics(engine)
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.include_router(router)
    return metrics


@router.get("/metrics")
async def metrics_endpoint(request: Request) -> Response:
    """The app's registry in the exposition format the scraper asks for (OpenMetrics or Prometheus text)."""
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encoder(request.app.state.metrics.registry), headers={"content-type": content_type})
