"""Liveness and readiness of `workbench serve`, and the warm-up that flips readiness.

- `GET|HEAD /health`: liveness. 200 whenever the process answers HTTP (even while warming up), so an
  orchestrator restarts only a server that stopped answering, never one that is still starting.
- `GET|HEAD /ready`: readiness. 503 (the error shape, `Retry-After: 1`) until the warm-up has run one
  beam search and one score request through the engine, 200 after; a failed warm-up keeps it 503 with
  the engine's message. Point a load balancer's or Kubernetes' readiness probe here.
- `GET /health_generate`: SGLang's name, with SGLang's meaning (`http_server.py`: 503 while the server
  is starting, else one 1-token generation through the engine within a timeout), so probes written for
  SGLang work unchanged; it costs a forward per call, `/ready` costs nothing.

vLLM has no readiness route of its own: its `/health` answers only once the engine has loaded (the
port opens after), which `/ready` gives here. Our port opens before the warm-up so that liveness and
readiness can differ: a vLLM probe on `/health` may see 200 up to one warm-up (a few forwards) early.

The warm-up runs as a task started by the app's lifespan (the model is loaded by then: the engine is
built before the app), so the port opens at once and `/ready` is observable as 503 while it runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from fastapi import APIRouter, Request

from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest
from workbench.engines.serving.errors import error_response

router = APIRouter()
log = logging.getLogger("uvicorn.error")  # uvicorn configures this one: the lines land next to its startup lines

HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's default (SGLANG_HEALTH_CHECK_TIMEOUT)
WARMUP_TOKEN = 0  # any id is valid in any vocabulary; the placeholder is never id 0 (it follows the base vocab)


@dataclass
class Readiness:
    """What `/ready` answers: ready once the warm-up succeeded; `error` says why it did not."""

    ready: bool = False
    error: str | None = None
    warmup_s: float | None = None


def warmup_requests(engine) -> tuple[BeamSearchRequest, ScoreRequest]:
    """A beam search of 2 steps (prefill, selection, one decode step) and a one-candidate score: every
    code path a request takes, at the smallest size the engine's limits allow."""
    limits = getattr(engine, "limits", None)
    steps = 2 if limits is None else max(1, min(2, limits.max_new_tokens))
    prompt = Prompt.of([WARMUP_TOKEN])
    return (BeamSearchRequest(prompt, beam_width=1, max_new_tokens=steps),
            ScoreRequest(prompt, ((WARMUP_TOKEN,),)))


async def warm_up(engine, state: Readiness) -> None:
    """Run `warmup_requests` through `engine` and flip `state.ready`; never raises (a failure is recorded).

    The engine calls are shielded: cancelling the warm-up (a shutdown before it finished) must not cancel
    the engine's futures under it, which its worker thread still resolves."""
    t0 = time.perf_counter()
    beam, score = warmup_requests(engine)
    try:
        (b,) = await asyncio.shield(engine.beam_search([beam]))
        (s,) = await asyncio.shield(engine.score([score]))
    except Exception as e:  # noqa: BLE001 - an engine that raises is not ready; say why
        state.error = f"warm-up raised {type(e).__name__}: {e}"
        log.error("workbench serve: %s; /ready stays 503", state.error)
        return
    failed = [r.error for r in (b, s) if not r.success]
    if failed:
        state.error = f"warm-up request failed: {failed[0]}"
        log.error("workbench serve: %s; /ready stays 503", state.error)
        return
    state.warmup_s = time.perf_counter() - t0
    state.ready = True
    log.info("workbench serve: warm-up done in %.3f s; ready", state.warmup_s)


def _not_ready(state: Readiness):
    why = state.error or "warming up: the start-up requests have not run through the engine yet"
    return error_response(503, f"not ready: {why}", "service_unavailable", headers={"retry-after": "1"})


@router.api_route("/health", methods=["GET", "HEAD"])
async def health(request: Request):
    app = request.app
    from workbench import malloc

    # the torch engine's GEMM library, chosen per machine at load (torch/onednn.py)
    gemm = getattr(getattr(app.state.engine, "lm", None), "gemm", None)
    return {"status": "ok", "engine": app.state.engine.name, "model": app.state.model_name,
            "ready": app.state.readiness.ready, **({"gemm": gemm} if gemm else {}),
            "malloc_hugepages": malloc.active()}  # started with malloc.TUNABLES (malloc.py)


@router.api_route("/ready", methods=["GET", "HEAD"])
async def ready(request: Request):
    state: Readiness = request.app.state.readiness
    if not state.ready:
        return _not_ready(state)
    return {"status": "ready", "engine": request.app.state.engine.name, "model": request.app.state.model_name,
            "warmup_s": state.warmup_s}


@router.get("/health_generate")
async def health_generate(request: Request):
    state: Readiness = request.app.state.readiness
    if not state.ready:
        return _not_ready(state)
    beam, _ = warmup_requests(request.app.state.engine)
    req = BeamSearchRequest(beam.prompt, beam_width=1, max_new_tokens=1)
    try:  # shielded: a timeout must not cancel the engine's future (its worker resolves it later)
        (r,) = await asyncio.wait_for(asyncio.shield(request.app.state.engine.beam_search([req])),
                                      HEALTH_GENERATE_TIMEOUT_S)
    except asyncio.TimeoutError:
        return error_response(503, f"the engine generated no token within {HEALTH_GENERATE_TIMEOUT_S:.0f} s",
                              "service_unavailable")
    if not r.success:
        return error_response(503, f"the engine failed a 1-token generation: {r.error}", "service_unavailable")
    return {"status": "ok"}
