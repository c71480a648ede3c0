"""`workbench serve` over real HTTP: uvicorn on a free loopback port, torch engine on a random checkpoint."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest  # noqa: E402
from workbench.engines.remote.http_engine import HTTPEngine  # noqa: E402
from workbench.engines.registry import create_engine  # noqa: E402
from workbench.engines.serving.app import create_app  # noqa: E402
from workbench.testing import make_random_checkpoint  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ck = make_random_checkpoint(tmp_path_factory.mktemp("srv") / "ck", n_items=40, levels=(4, 4), seed=5)
    engine = create_engine("torch", ck, max_candidates=64)
    port = free_port()
    app = create_app(engine, model_name="random", max_body_bytes=200_000)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield url, engine
    srv.should_exit = True  # graceful: finish in-flight requests, run the lifespan shutdown (closes the engine)
    th.join(timeout=30)
    assert not th.is_alive(), "server did not shut down"
    assert engine._thread is None, "engine was not closed on shutdown"


def test_health_and_capabilities(server):
    url, engine = server
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok"
    assert health["gemm"] == engine.lm.gemm in ("default", "onednn")  # the per-machine GEMM choice is visible
    caps = httpx.get(url + "/v1/capabilities").json()
    assert caps["features"]["multi_item_scoring"]["status"] == "native"


def test_completions_match_in_process(server):
    url, engine = server
    lim = engine.limits
    ids = [5, 6, lim.placeholder_id, 9, 10]
    vec = np.linspace(-1, 1, lim.user_vector_dim).tolist()
    body = {"prompt": ids, "n": 6, "max_tokens": 3, "use_beam_search": True, "user_vector": vec, "placeholder_pos": 2,
            "constrained": True, "banned_items": [0, 1]}
    d = httpx.post(url + "/v1/completions", json=body).json()
    assert d["object"] == "text_completion" and len(d["choices"]) == 6
    (ref,) = asyncio.run(engine.beam_search([BeamSearchRequest(Prompt.of(ids, vec, 2), 6, 3, True, (0, 1))]))
    assert [c["token_ids"] for c in d["choices"]] == [b.token_ids for b in ref.beams]
    assert np.allclose([c["cum_logprob"] for c in d["choices"]], [b.cum_logprob for b in ref.beams], atol=1e-5)
    assert d["usage"]["completion_tokens"] == 18


def test_score_endpoint(server):
    url, engine = server
    items = [[7, 8], [9], [10, 11, 12]]
    d = httpx.post(url + "/v1/score", json={"query": [5, 6, 7], "items": items, "label_token_ids": [3, 4],
                                            "apply_softmax": True}).json()
    assert d["object"] == "scoring" and len(d["scores"]) == 3
    assert np.allclose([sum(s) for s in d["scores"]], 1.0)
    seq = httpx.post(url + "/v1/score_sequences", json={"query": [5, 6, 7], "items": items}).json()
    (ref,) = asyncio.run(engine.score([ScoreRequest(Prompt.of([5, 6, 7]), tuple(map(tuple, items)))]))
    assert np.allclose(seq["scores"], ref.scores, atol=1e-5)


@pytest.mark.parametrize(
    "path,body,status,msg",
    [
        ("/v1/completions", {"prompt": [], "n": 2, "use_beam_search": True}, 400, "empty prompt"),
        ("/v1/completions", {"prompt": [5, 6], "n": 2}, 400, "use_beam_search"),
        ("/v1/completions", {"prompt": [5, 10**6], "n": 2, "use_beam_search": True}, 400, "outside the vocabulary"),
        ("/v1/completions", {"prompt": [5], "n": 999, "use_beam_search": True}, 400, "beam_width 999"),
        ("/v1/completions", {"prompt": "text", "n": 2}, 400, "use_beam_search"),  # a text prompt; n needs beam search
        ("/v1/score", {"query": [5], "items": [[1]] * 65, "label_token_ids": [3]}, 400, "exceed the engine limit"),
        ("/v1/score", {"query": [5], "items": [[1]]}, 400, "label_token_ids is required"),
        ("/v1/score", {"query": [5], "items": [[1]], "label_token_ids": [3], "mode": "label"}, 400,
         "/v1/score_sequences"),
        ("/v1/completions", {"prompt": [5] * 100_000, "n": 1}, 413, "exceeds the limit"),
    ],
)
def test_bad_requests_are_4xx(server, path, body, status, msg):
    url, _ = server
    r = httpx.post(url + path, json=body)
    assert r.status_code == status, r.text
    if msg:
        assert msg in r.json()["error"]["message"]


def test_http_engine_client(server):
    url, engine = server

    async def go():
        client = HTTPEngine(url)
        try:
            reqs = [BeamSearchRequest(Prompt.of([5 + i, 6, 7]), 4, 3) for i in range(8)]
            reqs.append(BeamSearchRequest(Prompt.of([]), 4, 3))
            res = await client.beam_search(reqs)
            sc = await client.score([ScoreRequest(Prompt.of([5, 6]), ((1, 2), (3,))),
                                     ScoreRequest(Prompt.of([5, 6]), ((1, 2), (3,)), "label", (3, 4))])
            caps = await client.fetch_capabilities()
            return reqs, res, sc, caps
        finally:
            await client.close()

    reqs, res, sc, caps = asyncio.run(go())
    ref = asyncio.run(engine.beam_search(reqs[:-1]))
    for a, b in zip(res[:-1], ref):
        assert a.success and [x.token_ids for x in a.beams] == [x.token_ids for x in b.beams]
    assert not res[-1].success and "HTTP 400" in res[-1].error and "empty prompt" in res[-1].error
    assert sc[0].success and len(sc[0].scores) == 2
    # label mode reads SGLang's token_logprobs: the engine's own label log-probs, not the probabilities
    ref = asyncio.run(engine.score([ScoreRequest(Prompt.of([5, 6]), ((1, 2), (3,)), m, lab)
                                    for m, lab in (("sequence", ()), ("label", (3, 4)))]))
    for got, want in zip(sc, ref):
        assert got.success and np.allclose(got.scores, want.scores, atol=1e-5), (got, want)
    assert caps.supports("soft_token")
