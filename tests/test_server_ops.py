"""Operations endpoints of `workbench serve`: liveness, readiness after the warm-up, Prometheus metrics.

One real server (`python -m workbench.cli serve`, torch engine, a tiny random soft-token checkpoint) serves
the module's HTTP tests; the metrics are parsed with prometheus_client's own parser and compared with what
was sent and what the answers reported:

- `/health` (GET and HEAD) is 200, `/ready` is 200 once the warm-up ran, `/health_generate` (SGLang's
  probe) generates a token;
- every request sent is counted once under its route and status (200, 400, 404, 405, 413, 422: the body
  limit's 413 too, answered before routing), the latency histograms count the same requests, the token
  counters equal the usage the answers reported, and the engine's batch histogram holds one forward per
  decode step of the completions sent.

In process (the real torch engine, wrapped): `/ready` is 503 in the error shape while the warm-up is held on
an event, and 200 after; the queue-depth gauge counts the requests a blocked scheduler has not taken yet;
two apps in one process keep their own registries; a 500 is counted.

Fault injection (done once while writing this, then reverted): with `/v1/score` left out of the counts
(`record` returning early for it), `test_metrics_count_what_was_sent` failed on the score counter (0 != 3);
with the metrics middleware installed before the body limit (inside it), the 413 was not counted (0 != 1);
with readiness starting as ready, the held-warm-up test failed on `/health`'s `ready` (True).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from workbench.engines.remote.launcher import free_port, launch, workbench_serve_spec  # noqa: E402
from workbench.engines.registry import create_engine  # noqa: E402
from workbench.engines.serving.app import create_app  # noqa: E402
from workbench.testing import make_random_checkpoint  # noqa: E402

pytestmark = pytest.mark.timeout(300)

COMPLETIONS, SCORE, METRICS = "/v1/completions", "/v1/score", "/metrics"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_random_checkpoint(tmp_path_factory.mktemp("serve_ops") / "ck", hidden_size=32, n_items=40,
                                  levels=(4, 4), vocab_base=120, max_position_embeddings=128, seed=7)


def _wait_ready(url: str, timeout_s: float = 120.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(url + "/ready", timeout=10)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


@pytest.fixture(scope="module")
def served(checkpoint):
    """The URL of a real `workbench serve` on the checkpoint, once it is ready."""
    spec = workbench_serve_spec(checkpoint, threads=1)
    with launch(spec, log_path=checkpoint.parent / "server.log") as server:
        assert _wait_ready(server.url).status_code == 200, server.log_tail()
        yield server.url


def samples(text: str) -> dict[tuple, float]:
    """{(sample name, sorted label pairs): value} of a Prometheus exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(url: str) -> dict[tuple, float]:
    r = httpx.get(url + METRICS, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text[:300]
    return samples(r.text)


def value(m: dict, name: str, **labels) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: dict, after: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def _raw_status(url: str, head: bytes) -> int:
    """Send raw request bytes (no body) and return the answer's status."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


# ---- liveness and readiness ---------------------------------------------------------------------------


def test_health_get_and_head(served):
    r = httpx.get(served + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["ready"] is True
    h = httpx.head(served + "/health")
    assert h.status_code == 200 and h.content == b""


def test_ready_after_startup_and_sglang_probe(served):
    r = httpx.get(served + "/ready")
    assert r.status_code == 200 and r.json()["status"] == "ready" and r.json()["warmup_s"] > 0
    assert httpx.head(served + "/ready").status_code == 200
    g = httpx.get(served + "/health_generate", timeout=60)
    assert g.status_code == 200 and g.json() == {"status": "ok"}


# ---- metrics against what was sent ----------------------------------------------------------------------


def test_metrics_count_what_was_sent(served):
    url = served
    before = scrape(url)
    beams = [({"prompt": [5 + i, 6, 7], "n": 2 + i % 3, "max_tokens": 1 + i % 3, "use_beam_search": True})
             for i in range(5)]
    scores = [{"query": [5, 6, 7 + i], "items": [[8, 9], [10]][: 1 + i % 2], "label_token_ids": [3, 4]}
              for i in range(3)]
    usage = {route: {"prompt_tokens": 0, "completion_tokens": 0} for route in (COMPLETIONS, SCORE)}
    for path, body in [*((COMPLETIONS, b) for b in beams), *((SCORE, b) for b in scores)]:
        r = httpx.post(url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text[:300]
        for k in usage[path]:
            usage[path][k] += r.json()["usage"].get(k) or 0
    errors = [
        (httpx.post(url + COMPLETIONS, json={"prompt": [], "n": 2, "use_beam_search": True}), 400, "POST", COMPLETIONS),
        (httpx.post(url + COMPLETIONS, json={"prompt": [True], "n": 2}), 422, "POST", COMPLETIONS),
        (httpx.get(url + "/no/such/route"), 404, "GET", "unmatched"),
        (httpx.get(url + SCORE), 405, "GET", SCORE),
    ]
    for r, status, _, _ in errors:
        assert r.status_code == status, r.text[:300]
    big = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: 23000000\r\n\r\n")
    assert _raw_status(url, big) == 413  # refused from the headers by the body limit, before any routing
    after = scrape(url)

    req = "workbench_http_requests_total"
    expected = {("POST", COMPLETIONS, "200"): len(beams), ("POST", SCORE, "200"): len(scores),
                ("POST", COMPLETIONS, "400"): 1, ("POST", COMPLETIONS, "422"): 1, ("GET", "unmatched", "404"): 1,
                ("GET", SCORE, "405"): 1, ("POST", COMPLETIONS, "413"): 1, ("GET", METRICS, "200"): 1}
    for (method, route, status), n in expected.items():
        assert delta(before, after, req, method=method, route=route, status=status) == n, (method, route, status)
    # nothing else moved: every request sent is counted exactly once
    moved = {k: after[k] - before.get(k, 0.0) for k in after if k[0] == req and after[k] != before.get(k, 0.0)}
    assert sum(moved.values()) == sum(expected.values()), moved

    # the latency histograms hold the same requests, per (method, route)
    hist = "workbench_http_request_duration_seconds"
    for method, route in {(m, r) for m, r, _ in expected}:
        n = sum(v for (m, r, _), v in expected.items() if (m, r) == (method, route))
        assert delta(before, after, hist + "_count", method=method, route=route) == n, (method, route)
        assert delta(before, after, hist + "_bucket", method=method, route=route, le="+Inf") == n
        assert delta(before, after, hist + "_sum", method=method, route=route) > 0

    # the token counters equal the usage the answers reported, per route
    for route in (COMPLETIONS, SCORE):
        got = (delta(before, after, "workbench_prompt_tokens_total", route=route),
               delta(before, after, "workbench_generation_tokens_total", route=route))
        assert got == (usage[route]["prompt_tokens"], usage[route]["completion_tokens"]), route
    assert usage[COMPLETIONS]["completion_tokens"] == sum(b["n"] * b["max_tokens"] for b in beams)  # every beam
    assert usage[SCORE]["prompt_tokens"] > 0
    assert value(after, "workbench_engine_requests_waiting") == 0  # nothing in flight between scrapes


def test_batch_histogram_counts_the_forwards(served):
    """Completions sent one at a time: one forward per generated position (prefill + max_tokens - 1 decode
    steps), each holding that one request."""
    url = served
    bodies = [{"prompt": [9, 8, 7, i + 5], "n": 3, "max_tokens": 1 + i % 3, "use_beam_search": True} for i in range(4)]
    before = scrape(url)
    for b in bodies:
        assert httpx.post(url + COMPLETIONS, json=b, timeout=60).status_code == 200
    after = scrape(url)
    forwards = sum(b["max_tokens"] for b in bodies)
    assert delta(before, after, "workbench_engine_batch_requests_count") == forwards
    assert delta(before, after, "workbench_engine_batch_requests_sum") == forwards  # one request in each
    assert delta(before, after, "workbench_engine_batch_tokens_count") == forwards
    prefill = sum(len(b["prompt"]) for b in bodies)
    assert delta(before, after, "workbench_engine_batch_tokens_sum") >= prefill


# ---- in process: the real torch engine, wrapped ----------------------------------------------------------


class HeldWarmUp:
    """The real torch engine, whose first beam search (the start-up warm-up) waits for `release`."""

    def __init__(self, engine):
        self.engine, self.name, self.limits = engine, engine.name, engine.limits
        self.release = threading.Event()

    async def beam_search(self, requests):
        await asyncio.to_thread(self.release.wait)
        return await self.engine.beam_search(requests)

    async def score(self, requests):
        return await self.engine.score(requests)

    def capabilities(self):
        return self.engine.capabilities()

    async def close(self) -> None:
        await self.engine.close()


def _serve_in_thread(app):
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url, srv, th
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError("the in-process server did not answer /health")


def test_ready_is_503_until_the_warm_up_has_run(checkpoint):
    held = HeldWarmUp(create_engine("torch", checkpoint))
    url, srv, th = _serve_in_thread(create_app(held, model_name="held"))
    try:
        live = httpx.get(url + "/health")
        assert live.status_code == 200 and live.json()["ready"] is False  # alive while warming up
        r = httpx.get(url + "/ready")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        err = r.json()["error"]
        assert set(r.json()) == {"error"} and err["code"] == 503 and err["type"] == "service_unavailable"
        assert "warming up" in err["message"], err
        assert httpx.head(url + "/ready").status_code == 503
        assert httpx.get(url + "/health_generate").status_code == 503
        assert httpx.get(url + "/metrics").status_code == 200
        held.release.set()
        r = _wait_ready(url, 60)
        assert r.status_code == 200 and r.json()["warmup_s"] > 0
    finally:
        held.release.set()
        srv.should_exit = True
        th.join(timeout=30)
    assert not th.is_alive() and held.engine._thread is None  # the lifespan closed the engine


def test_queue_depth_counts_what_the_scheduler_has_not_taken(checkpoint):
    """Scheduler held inside its first forward: with a 4-token budget it took one 3-token prompt, the other
    two wait, and the gauge of a scrape says 2; 0 once all are done."""
    from prometheus_client import generate_latest

    from workbench.engines.base import BeamSearchRequest, Prompt
    from workbench.engines.serving.metrics import ServerMetrics

    engine = create_engine("torch", checkpoint, max_batch_tokens=4)
    metrics = ServerMetrics(engine)
    inside, release = threading.Event(), threading.Event()
    forward = engine._iteration

    def held_forward(pre, dec, sc):
        inside.set()
        release.wait(30)
        return forward(pre, dec, sc)

    engine._iteration = held_forward

    async def go():
        reqs = [BeamSearchRequest(Prompt.of([5, 6, 7 + i]), 2, 2) for i in range(3)]
        task = asyncio.ensure_future(engine.beam_search(reqs))
        await asyncio.to_thread(inside.wait, 30)
        waiting = samples(generate_latest(metrics.registry).decode())
        release.set()
        return waiting, await task

    try:
        waiting, results = asyncio.run(go())
    finally:
        release.set()
        asyncio.run(engine.close())
    assert value(waiting, "workbench_engine_requests_waiting") == 2
    assert all(r.success for r in results)
    assert engine.queue_depth() == 0
    done = samples(generate_latest(metrics.registry).decode())
    assert value(done, "workbench_engine_batch_requests_count") >= 3


def test_two_apps_keep_their_own_metrics_and_a_500_is_counted(checkpoint):
    """Two apps in one process (a registry each, no duplicate-metric error); an engine that raises gives a 500
    in the error shape, counted as one."""
    engine = create_engine("torch", checkpoint)

    class Broken(HeldWarmUp):
        def capabilities(self):
            raise RuntimeError("boom")

    async def go():
        apps = [create_app(engine, close_engine=False), create_app(Broken(engine), close_engine=False)]
        out = []
        for app in apps:
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
                caps = await client.get("/v1/capabilities")
                out.append((caps.status_code, samples((await client.get("/metrics")).text)))
        return out

    try:
        (ok, m1), (failed, m2) = asyncio.run(go())
    finally:
        asyncio.run(engine.close())
    assert (ok, failed) == (200, 500)
    caps = {"method": "GET", "route": "/v1/capabilities"}
    assert value(m1, "workbench_http_requests_total", status="200", **caps) == 1
    assert value(m1, "workbench_http_requests_total", status="500", **caps) == 0
    assert value(m2, "workbench_http_requests_total", status="500", **caps) == 1
    assert value(m2, "workbench_http_requests_total", status="200", **caps) == 0
