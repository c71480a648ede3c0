"""The engine contract: registry, capabilities, and bad input rejected with a clear message in the result."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys

import numpy as np
import pytest

from workbench.engines import registry
from workbench.engines.base import FEATURES, BeamSearchRequest, EngineUnavailable, Prompt, ScoreRequest, Support


def test_importing_registry_is_light():
    code = ("import sys, workbench.engines.registry as r; r.capability_matrix(); "
            "heavy = [m for m in ('torch', 'transformers', 'vllm', 'sglang', 'tensorrt_llm') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_capability_matrix_covers_every_engine_and_feature():
    m = registry.capability_matrix()
    assert set(m) == {"torch", "hf", "vllm", "sglang", "trtllm"}
    for name, row in m.items():
        assert set(row["features"]) == set(FEATURES)
        for cell in row["features"].values():
            assert cell["status"] in {s.value for s in Support}
            if cell["status"] != "native":
                assert cell["reason"], (name, cell)
    assert m["torch"]["available"] and m["hf"]["available"]
    assert all(c["status"] == "native" for f, c in m["torch"]["features"].items() if f != "fanout_scoring")
    table = registry.capability_table_markdown()
    assert table.startswith("| feature | torch | hf | vllm | sglang | trtllm |")
    assert "multi_item_scoring" in table


def test_unknown_and_unavailable_engines():
    with pytest.raises(KeyError, match="known engines"):
        registry.create_engine("nope", checkpoint="x")
    for name in ("sglang", "trtllm"):
        ok, how = registry.availability(name)
        if not ok:
            assert how
            with pytest.raises(EngineUnavailable, match=name):
                registry.create_engine(name, checkpoint="x")


pytest.importorskip("torch")


@pytest.fixture(scope="module", params=["torch", "hf"])
def engine(request, tmp_path_factory):
    from workbench.testing import make_random_checkpoint

    ck = make_random_checkpoint(tmp_path_factory.mktemp("ck") / "ck", n_items=30, levels=(4, 4), seed=2,
                                max_position_embeddings=64)
    eng = registry.create_engine(request.param, ck, max_beam_width=8, max_candidates=5, max_new_tokens=4)
    yield eng
    asyncio.run(eng.close())


def _bad_beam_requests(lim):
    ph, dim = lim.placeholder_id, lim.user_vector_dim
    vec = [0.1] * dim
    ok = [5, 6, ph, 7]
    return {
        "user vector has 3 values": BeamSearchRequest(Prompt.of(ok, [0.1] * 3, 2), 2, 2),
        "NaN or inf": BeamSearchRequest(Prompt.of(ok, [math.nan] + vec[1:], 2), 2, 2),
        "exactly one <|user|> placeholder, found 0": BeamSearchRequest(Prompt.of([5, 6, 7], vec, 1), 2, 2),
        "exactly one <|user|> placeholder, found 2": BeamSearchRequest(Prompt.of([ph, 6, ph], vec, 0), 2, 2),
        "but no user vector": BeamSearchRequest(Prompt.of(ok), 2, 2),
        "is not a position of the prompt": BeamSearchRequest(Prompt.of(ok, vec, 9), 2, 2),
        "empty prompt": BeamSearchRequest(Prompt.of([]), 2, 2),
        "exceeds the model's limit of 64": BeamSearchRequest(Prompt.of([5] * 63), 2, 2),
        "beam_width 9 outside 1..8": BeamSearchRequest(Prompt.of([5, 6]), 9, 2),
        "max_new_tokens 5 outside": BeamSearchRequest(Prompt.of([5, 6]), 2, 5),
        "outside the vocabulary": BeamSearchRequest(Prompt.of([5, 10**6]), 2, 2),
        "set max_new_tokens <= 3": BeamSearchRequest(Prompt.of([5, 6]), 2, 4, constrained=True),
        "banned_items outside the catalog": BeamSearchRequest(Prompt.of([5, 6]), 2, 3, constrained=True, banned_items=(999,)),
    }


def test_bad_beam_requests_fail_alone(engine):
    bad = _bad_beam_requests(engine.limits)
    good = BeamSearchRequest(Prompt.of([5, 6, 7]), beam_width=3, max_new_tokens=3, constrained=True, banned_items=(0,))
    reqs = [good, *bad.values(), good]
    results = asyncio.run(engine.beam_search(reqs))
    assert [r.request_id for r in results] == [r.request_id for r in reqs]
    assert results[0].success and results[-1].success and len(results[0].beams) == 3
    assert results[0].beams[0].token_ids == results[-1].beams[0].token_ids
    assert abs(results[0].beams[0].cum_logprob - results[-1].beams[0].cum_logprob) < 1e-4
    for (msg, _), res in zip(bad.items(), results[1:-1]):
        assert not res.success and msg in res.error, (msg, res.error)
        assert res.beams == []


def test_bad_score_requests_fail_alone(engine):
    p = Prompt.of([5, 6, 7])
    bad = {
        "no candidates": ScoreRequest(p, ()),
        "exceed the engine limit of 5": ScoreRequest(p, ((1,),) * 6),
        "needs label_token_ids": ScoreRequest(p, ((1,),), mode="label"),
        "unknown score mode": ScoreRequest(p, ((1,),), mode="pairwise"),
        "empty candidate": ScoreRequest(p, ((1,), ())),
        "candidate token ids outside": ScoreRequest(p, ((1, 10**6),)),
        "label token ids outside": ScoreRequest(p, ((1,),), mode="label", label_token_ids=(-1,)),
    }
    good = ScoreRequest(p, ((8, 9), (10,)), mode="label", label_token_ids=(3, 4))
    results = asyncio.run(engine.score([*bad.values(), good]))
    for (msg, _), res in zip(bad.items(), results):
        assert not res.success and msg in res.error, (msg, res.error)
    assert results[-1].success and np.asarray(results[-1].scores).shape == (2, 2)
    assert np.all(np.asarray(results[-1].scores) <= 0)


def test_capabilities(engine):
    caps = engine.capabilities()
    assert caps.engine == engine.name and set(caps.features) == set(FEATURES)
    assert caps.supports("beam_search_all_beams") and caps.supports("soft_token")
