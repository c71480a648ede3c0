"""Notebook 03 executed with papermill on the session's vLLM server and small parameters; asserts on its JSON."""

from __future__ import annotations

import json

import pytest
from vllm_fixtures import vllm_session

from workbench.paths import REPO_ROOT

NOTEBOOK = REPO_ROOT / "notebooks" / "03_engine_features.ipynb"


@pytest.mark.notebook
@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_notebook_03_runs(tmp_path):
    import papermill as pm

    sess = vllm_session()  # reuses the live server (skips / fails in CI like the vLLM tests)
    results = tmp_path / "engine_features.json"
    pm.execute_notebook(
        str(NOTEBOOK), str(tmp_path / "03_out.ipynb"), kernel_name="python3", cwd=str(tmp_path),
        parameters={"checkpoint": str(sess.checkpoint), "engines": ["vllm", "sglang"], "vllm_url": sess.url,
                    "n_prompts": 1, "prompt_len": 16, "beam_width": 3, "n_candidates": 4, "latency_repeats": 1,
                    "results_path": str(results)},
    )
    out = json.loads(results.read_text())
    m = out["capability_matrix"]
    assert set(m) >= {"torch", "vllm", "sglang", "trtllm"}
    assert m["sglang"]["features"]["beam_search_all_beams"]["status"] in ("written, not run here", "native")
    assert "sglang" in out["unavailable"]  # not installed here, and the notebook says so
    vllm = out["parity"]["vllm"]
    assert vllm["ok"], vllm
    passed = {c["name"] for c in vllm["cases"] if c["status"] == "passed"}
    assert {"beam_search", "beam_search_constrained", "beam_search_soft_token", "score_sequence"} <= passed
    lat = out["latency"]
    assert lat["torch/beam"]["median_s"] > 0 and lat["vllm/beam"]["median_s"] > 0
    assert "vllm/beam_soft_token" in lat and out["transport"]["vllm"]["bytes"] > 0
