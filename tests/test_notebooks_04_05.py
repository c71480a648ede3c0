"""Execute notebooks 04 (a load sweep) and 05 (the report, from MLflow only) with small parameters.

04 sweeps two fixed rates on a tiny random checkpoint with the in-process torch and hf engines and
logs to a temporary MLflow store; 05 then reads that store and writes the HTML report. Both write
a small JSON record, asserted here.
"""

from __future__ import annotations

import json
import math

import pytest

from workbench.paths import REPO_ROOT

NB04 = REPO_ROOT / "notebooks" / "04_latency_and_cost.ipynb"
NB05 = REPO_ROOT / "notebooks" / "05_study_report.ipynb"


@pytest.mark.notebook
@pytest.mark.timeout(900)
def test_notebooks_04_then_05(tmp_path, monkeypatch):
    import papermill as pm

    from workbench.testing import make_random_checkpoint

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernels' torch: no OpenMP spinning on a shared machine
    ckpt = make_random_checkpoint(tmp_path / "ckpt", hidden_size=32, n_items=60, levels=(4, 4), vocab_base=120,
                                  soft_token=False, max_position_embeddings=256)  # fmt: skip
    overrides = {
        "tracking": {"experiment": "nb_load"},
        "engines": [{"name": "torch", "transport": "inprocess"}, {"name": "hf", "transport": "inprocess"}],
        "load": {"checkpoints": [str(ckpt)], "prompt_tokens": 16, "beam_width": 4, "max_new_tokens": 3,
                 "rates": [3.0, 8.0], "requests_per_rate": 10, "warmup_requests": 1, "unloaded_requests": 3,
                 "slo_ms": 30000},
        "cost": {"reference_engine": "hf", "usd_per_hour": 2.0},
    }  # fmt: skip
    rec04 = tmp_path / "nb04.json"
    pm.execute_notebook(
        str(NB04), str(tmp_path / "04.ipynb"), kernel_name="python3", cwd=str(tmp_path), progress_bar=False,
        parameters={"experiment": str(REPO_ROOT / "experiments" / "beam_search_load.yaml"), "overrides": overrides,
                    "results_json": str(rec04)},
    )  # fmt: skip
    r = json.loads(rec04.read_text())
    assert r["experiment"] == "nb_load" and r["slo_ms"] == 30000
    assert r["series"] == ["hf", "torch"] and r["errors"] == {}  # the cost reference runs first
    assert r["rates"] == {"hf": [3.0, 8.0], "torch": [3.0, 8.0]}
    assert r["failures"] == {"hf": 0, "torch": 0}
    for s in ("hf", "torch"):
        assert all(0 < p < 30000 for p in r["p99_ms"][s])
        sat = r["saturation_qps"][s]
        assert sat is not None and 1.0 < sat < 20.0  # at most ~8 req/s offered, everything inside a 30 s SLO
        assert r["usd_per_1m"][s] == pytest.approx(2.0 / (sat * 3600) * 1e6)
        assert 0 <= r["client_cpu_share_max"][s] < 4

    rec05 = tmp_path / "nb05.json"
    report_path = tmp_path / "reports" / "study.html"
    pm.execute_notebook(
        str(NB05), str(tmp_path / "05.ipynb"), kernel_name="python3", cwd=str(tmp_path), progress_bar=False,
        parameters={"experiments": ["nb_load"], "report_path": str(report_path), "results_json": str(rec05)},
    )
    q = json.loads(rec05.read_text())
    assert q["load_runs"] == 2 and q["finished_load_runs"] == 2 and q["rate_points"] == 4
    assert q["figures"] == ["beam_search/p16/b4/n3/u: latency vs achieved QPS",
                            "beam_search/p16/b4/n3/u: throughput vs offered rate",
                            "beam_search/p16/b4/n3/u: cost per 1M requests"]  # fmt: skip
    assert q["saturation_qps"] == pytest.approx(r["saturation_qps"])  # 05 reads back what 04 measured
    assert q["report_path"] == str(report_path) and report_path.stat().st_size == q["report_bytes"] > 1e6
    text = report_path.read_text()
    assert text.count("Plotly.newPlot(") == 3 and not math.isnan(q["not_joined"])
