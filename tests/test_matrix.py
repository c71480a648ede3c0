"""The method x engine matrix (workbench/load/matrix.py): quality through each engine, agreement with torch.

The tiny study of test_bench_study.py is trained through the real pipeline; a sweep with `load.quality_users`
then ranks the same user sample of each checkpoint through the in-process torch and hf engines and through a
torch engine that drops the best beam of every third request (a broken engine, not a mock: the real engine's
answers with one beam removed). Checked: torch agrees with itself on every list; the dropping engine is caught
(exactly its dropped third of the lists differ); quality comes with an interval; every cell says how
each feature its method needs ran; with an SLO no rate can hold, every cell is costed at its serial capacity,
labelled; the parent run holds matrix.csv and its three figures; the report's matrix section draws them.

Fault injection (by hand): the agreement computed against the cell itself instead of the reference -> the
dropping engine agrees 100% and the test fails; compare_beams given the reference twice -> no user beyond the
bound for the dropping engine, fails; `required_features` without the soft token -> the soft_token
cell's marks miss `soft_token_beam_search`, fails.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from test_bench_study import trained_study  # noqa: F401 - the fixture: a tiny study trained in a temporary store

from workbench import names

pytestmark = pytest.mark.timeout(900)

USERS = 24


class DropsBestBeam:
    """The real torch engine, minus the best beam of every third request (the engine that loses a beam)."""

    def __init__(self, inner):
        self.inner, self.n, self.name = inner, 0, inner.name

    async def beam_search(self, requests):
        out = []
        for r in await self.inner.beam_search(requests):
            self.n += 1
            out.append(dataclasses.replace(r, beams=r.beams[1:]) if r.success and self.n % 3 == 0 else r)
        return out

    async def score(self, requests):
        return await self.inner.score(requests)

    def capabilities(self):
        return self.inner.capabilities()

    async def close(self):
        await self.inner.close()


def test_matrix_cells_carry_quality_agreement_marks_and_serial_cost(trained_study, tmp_path):  # noqa: F811
    from mlflow.tracking import MlflowClient

    from workbench.config import parse_config
    from workbench.engines.registry import create_engine
    from workbench.load.bench import run_bench
    from workbench.load.matrix import matrix_table

    def factory(entry, ckpt):
        inner = create_engine(entry.name, checkpoint=ckpt)
        return DropsBestBeam(inner) if entry.label == "drops" else inner

    cfg = parse_config({
        "name": "matrix", "tracking": {"experiment": "matrix"},
        "engines": [{"name": "torch"}, {"name": "hf"}, {"name": "torch", "label": "drops"}],
        "load": {"workload": "personalization", "study": str(trained_study), "prompts_from": "test_split",
                 "checkpoints": ["trained:none", "trained:soft_token"], "beam_width": 30, "max_new_tokens": 3,
                 "constrained": True, "rates": [4.0], "requests_per_rate": 6, "warmup_requests": 1,
                 "unloaded_requests": 3, "time_cap_s": 60, "quality_users": USERS,
                 "slo_ms": 0.001},  # no rate can hold: every cell falls back to its serial capacity
        "cost": {"usd_per_hour": 3.6, "reference_engine": "torch"},
    })  # fmt: skip
    res = run_bench(cfg, engine_factory=factory, progress=False)
    assert [c.error for c in res.children] == [None] * 6
    cells = {(c.method, c.series): c for c in res.children}
    for (method, series), c in cells.items():
        m = c.matrix
        assert m[names.MATRIX_USERS] == USERS
        assert m[names.MATRIX_NDCG_LO] <= m[names.MATRIX_NDCG] <= m[names.MATRIX_NDCG_HI]
        assert 0.0 <= m[names.MATRIX_AGREE] <= 1.0
        need = ["beam_search_all_beams", "trie_constraint"] + (["soft_token_beam_search"] if method == "soft_token"
                                                               else [])
        assert [f.split("=")[0] for f in c.features.split("; ")] == need, c.features
        assert c.saturation_qps is None and math.isinf(c.usd_per_1m)
        assert m[names.SERIAL_QPS] == pytest.approx(1e3 / c.unloaded_p50_ms)
        assert math.isfinite(m[names.COST_PER_1M_SERIAL]) and m[names.BEST_P99] > 0
    for method in ("none", "soft_token"):
        ref, drops = cells[(method, "torch")], cells[(method, "drops")]
        assert ref.matrix[names.MATRIX_AGREE] == 1.0 and ref.matrix[names.MATRIX_MAX_CHANGE] == 0.0
        assert ref.matrix[names.MATRIX_BEYOND_BOUND] == 0 and ref.matrix[names.MATRIX_MAX_LOGPROB_DIFF] == 0.0
        # hf computes the same model another way: whatever differs is within the rounding bound
        hf = cells[(method, "hf")].matrix
        assert hf[names.MATRIX_BEYOND_BOUND] == 0 and hf[names.MATRIX_MAX_LOGPROB_DIFF] <= hf[names.MATRIX_BOUND]
        # the dropping engine is caught: the sample is its first 24 requests, and every third lost its best item
        # (beams are distinct SIDs, hence distinct items: each such top-10 list differs)
        assert drops.matrix[names.MATRIX_AGREE] == pytest.approx(1.0 - (USERS // 3) / USERS)
        assert drops.matrix[names.MATRIX_MAX_CHANGE] >= 0.0
        assert drops.matrix[names.MATRIX_BEYOND_BOUND] == USERS // 3  # a lost beam is no tie

    table = matrix_table(res.summary())
    assert len(table) == 6 and set(table["cost_basis"]) == {"serial capacity (no rate within SLO)"}
    client = MlflowClient()
    arts = {a.path for a in client.list_artifacts(res.parent_run_id)}
    assert {"matrix.csv", "matrix_cost.html", "matrix_quality.html", "matrix_pareto.html"} <= arts
    logged = client.get_run(cells[("none", "drops")].run_id).data
    assert logged.metrics[names.MATRIX_AGREE] == pytest.approx(cells[("none", "drops")].matrix[names.MATRIX_AGREE])
    assert logged.tags[names.TAG_FEATURES] == cells[("none", "drops")].features


def test_matrix_needs_test_prompts_and_the_torch_reference():
    from workbench.config import ConfigError, parse_config

    base = {"name": "m", "load": {"workload": "personalization", "study": "x.yaml", "prompts_from": "test_split",
                                  "checkpoints": ["trained:none"], "quality_users": 8},
            "cost": {"reference_engine": "torch"}}  # fmt: skip
    parse_config(base)
    with pytest.raises(ConfigError, match="prompts_from: test_split"):
        parse_config({**base, "load": {**base["load"], "prompts_from": "synthetic"}})
    with pytest.raises(ConfigError, match="cost.reference_engine: torch"):
        parse_config({**base, "engines": [{"name": "hf"}], "cost": {"reference_engine": "hf"}})


@pytest.mark.notebook
def test_notebook_04_shows_the_matrix(trained_study, tmp_path):  # noqa: F811
    """Notebook 04 on a matrix sweep of the tiny study (torch and hf in-process): the matrix table, its figures."""
    import json

    import papermill as pm

    from workbench.paths import REPO_ROOT

    out = tmp_path / "nb04.json"
    overrides = {
        "name": "nb_matrix", "tracking": {"experiment": "nb_matrix"},
        "engines": [{"name": "torch", "transport": "inprocess"}, {"name": "hf", "transport": "inprocess"}],
        "load": {"study": str(trained_study), "checkpoints": ["trained:none", "trained:soft_token"],
                 "max_new_tokens": 3, "rates": [4.0], "requests_per_rate": 6, "warmup_requests": 1,
                 "unloaded_requests": 3, "quality_users": 8, "slo_ms": 60000},
    }  # fmt: skip
    pm.execute_notebook(
        str(REPO_ROOT / "notebooks" / "04_latency_and_cost.ipynb"), str(tmp_path / "04.ipynb"), kernel_name="python3",
        cwd=str(tmp_path), progress_bar=False,
        parameters={"experiment": str(REPO_ROOT / "experiments" / "matrix_quickstart.yaml"), "overrides": overrides,
                    "results_json": str(out)},
    )  # fmt: skip
    rows = json.loads(out.read_text())["matrix"]
    assert sorted((r["method"], r["series"]) for r in rows) == [("none", "hf"), ("none", "torch"),
                                                                ("soft_token", "hf"), ("soft_token", "torch")]
    assert all(r["agree_top10"] is not None and 0 <= r["agree_top10"] <= 1 for r in rows)
    assert all(r["cost_basis"] == "saturation within SLO" and r["usd_per_1m"] > 0 for r in rows)
    executed = json.loads((tmp_path / "04.ipynb").read_text())
    shown = [o for c in executed["cells"] for o in c.get("outputs", [])
             if "application/vnd.plotly.v1+json" in o.get("data", {})]
    titles = {o["data"]["application/vnd.plotly.v1+json"]["layout"]["title"]["text"] for o in shown}
    assert sum(t.startswith("matrix:") for t in titles) == 3, titles  # cost, quality, the fronts
