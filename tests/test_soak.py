"""The soak of `workbench serve` (workbench/load/soak.py), short: a real server, the five request kinds mixed.

`test_short_soak_holds` starts a real `workbench serve` (torch engine, a tiny random soft-token checkpoint) and sends
2,000 mixed requests at concurrency 12 after the warm-up (~15 s of load here): no failure, every answer within the
derived numeric bound of the in-process reference, and the server's RSS after warm-up within the derived memory
bound. 2,000 rather than a few hundred: the memory check can only see a leak of more than bound / requests bytes
per request, and at this size (29 MiB here, half of it one huge page per server thread) that is ~15 kB: a
request's prompt KV (96 tokens x 512 B) is 48 kB.

The other tests are unit tests of the pieces (no server): failures sorted by kind, malformed answers caught, a
result moved past the bound caught, memory of a process tree read from /proc.

Fault injection (done once while writing this, then reverted): a per-request cache in the server that is never
freed (the torch engine's `_finish_beam` / `_finish_scores` keeping each request's prompt KV in a module-level dict
keyed by request id) made `test_short_soak_holds` fail on memory (RSS grew 142.8 MiB after warm-up, over the
29.1 MiB bound; with the cache gone it grew 0.6 MiB); score answers compared without the bound (`ok = True`)
made `test_a_result_past_the_bound_is_caught` fail on the score kinds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from workbench.engines.base import Beam, BeamSearchResult, ScoreResult  # noqa: E402
from workbench.load.soak import (  # noqa: E402
    MIX,
    SoakMix,
    SoakSettings,
    compare_with_reference,
    failure_kind,
    malformed,
    run_soak,
    tree_memory,
)
from workbench.sync import run_sync  # noqa: E402
from workbench.testing import make_random_checkpoint  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_random_checkpoint(tmp_path_factory.mktemp("soak") / "ck", hidden_size=64, n_items=60, levels=(4, 4),
                                  vocab_base=120, max_position_embeddings=256, seed=3)


def test_short_soak_holds(checkpoint):
    settings = SoakSettings(requests=2000, concurrency=12, prompt_tokens=96, progress_every_s=0)
    r = run_soak(checkpoint, settings, log_path=checkpoint.parent / "server.log")
    assert r.sent == 2000 and r.warmup_requests == 6 * 12
    assert r.failures == {}, r.failure_examples
    assert set(r.kinds) == set(MIX) and all(n > 0 for n in r.kinds.values()), r.kinds
    assert sum(p["compared"] for p in r.parity.values()) == 2000
    assert r.outside_bound == 0, r.parity
    m = r.memory
    assert m["measured"] and m["start"] > 0 and m["warm"] >= m["start"] * 0.5
    assert len(m["samples"]) > 10  # sampled through the run, not only at three points
    assert m["growth"] <= r.bound["total"], r.line()
    assert r.ok, r.line()


def test_failures_are_sorted_by_kind():
    assert failure_kind("timeout: no result within 120 s") == "timeout"
    assert failure_kind("HTTP transport error: ReadError: ") == "transport"
    assert failure_kind("HTTP 503: not ready") == "http_503"
    assert failure_kind("KeyError: 'choices'") == "malformed"


def test_malformed_answers_are_caught(checkpoint):
    mix = SoakMix(checkpoint, SoakSettings(requests=50, concurrency=4))
    i = next(j for j in range(50) if mix.kind_of(j) == "beam_constrained")
    req = mix.request(i)
    sid = mix.catalog.sid_tokens
    good = [Beam(sid(k), -1.0 - k) for k in range(60) if k not in req.banned_items][: req.beam_width]
    assert malformed(req, BeamSearchResult(req.request_id, beams=good), mix) is None
    assert "beams for beam width" in malformed(req, BeamSearchResult(req.request_id, beams=good[:-1]), mix)
    banned = [Beam(sid(req.banned_items[0]), 0.0)] + good[1:]
    assert "banned item" in malformed(req, BeamSearchResult(req.request_id, beams=banned), mix)
    assert "best first" in malformed(req, BeamSearchResult(req.request_id, beams=good[::-1]), mix)
    j = next(j for j in range(50) if mix.kind_of(j) == "score_label")
    sreq = mix.request(j)
    ok = [[-1.0, -2.0]] * len(sreq.candidates)
    assert malformed(sreq, ScoreResult(sreq.request_id, scores=ok), mix) is None
    assert "shape" in malformed(sreq, ScoreResult(sreq.request_id, scores=[[-1.0]] * len(sreq.candidates)), mix)
    assert "non-finite" in malformed(sreq, ScoreResult(sreq.request_id, scores=[[float("nan"), 0.0]] + ok[1:]), mix)


def test_a_result_past_the_bound_is_caught(checkpoint):
    """The reference's own answers are inside; the same answers moved by twice the bound are outside."""
    from workbench.engines.registry import create_engine

    mix = SoakMix(checkpoint, SoakSettings(requests=40, concurrency=4))
    reqs = [mix.request(i) for i in range(40)]
    ref = create_engine("torch", checkpoint=checkpoint)

    async def go():
        answers = {}
        for r in reqs:
            run = ref.beam_search if hasattr(r, "beam_width") else ref.score
            answers[r.request_id] = (await run([r]))[0]
        same = await compare_with_reference(ref, reqs, answers, batch=16)
        moved = {}
        for rid, a in answers.items():
            tol = same[rid.split("-", 1)[1]]["bound"]
            if isinstance(a, BeamSearchResult):
                moved[rid] = BeamSearchResult(rid, beams=[Beam(b.token_ids, b.cum_logprob - 2 * tol) for b in a.beams])
            else:
                import numpy as np

                moved[rid] = ScoreResult(rid, scores=(np.asarray(a.scores) + 2 * tol).tolist())
        return same, await compare_with_reference(ref, reqs, moved, batch=16)

    try:
        same, moved = run_sync(go())
    finally:
        ref.shutdown()
    assert all(p["outside_bound"] == 0 for p in same.values()), same
    assert all(p["outside_bound"] == p["compared"] > 0 for p in moved.values()), moved
    assert set(same) == set(MIX)


def test_tree_memory_counts_the_children():
    """A child holding 64 MiB shows in its parent's tree."""
    code = "import sys,time; b=bytearray(64<<20); b[::4096]=b'x'*(len(b)//4096); print('ok',flush=True); time.sleep(30)"
    spawn = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {code!r}]).wait()"
    parent = subprocess.Popen([sys.executable, "-c", spawn], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert parent.stdout.readline().startswith("ok")
        alone = tree_memory(parent.pid)
        assert alone["processes"] == 2 and alone["rss"] > 64 << 20 and alone["threads"] >= 2
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the parent and its child (their own session)
        parent.wait()
