"""`run_bench`: short real sweeps against the torch engine, logged to a temporary real MLflow store.

- a sweep of 2 rates x 16 requests on a tiny random checkpoint, in-process torch engine;
- a sweep where the engine fails every 4th request (a wrapper around the real torch engine), plus
  an engine that cannot start here: failures are counted, every run is still logged.
"""

from __future__ import annotations

import csv
import io
import math

import pytest

from workbench import names
from workbench.load.bench import run_bench
from workbench.config import parse_config
from workbench.engines.base import BeamSearchResult

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture
def store(tmp_path, monkeypatch, mlflow_store, data_dir):
    """A client of the test's temporary MLflow store (conftest); the working folder is tmp too."""
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) lands in tmp too
    from mlflow.tracking import MlflowClient

    return MlflowClient(mlflow_store)


def config(checkpoint, engines, workload="beam_search", **load):
    return parse_config({
        "name": "bench_test", "engines": engines,
        "tracking": {"experiment": "bench_test"},
        "load": {"workload": workload, "checkpoints": [str(checkpoint)], "prompt_tokens": 24, "beam_width": 4,
                 "max_new_tokens": 3, "candidates": 12, "candidate_tokens": 3, "rates": [4.0, 12.0],
                 "requests_per_rate": 16, "warmup_requests": 2, "unloaded_requests": 3, "time_cap_s": 60, **load},
        "cost": {"usd_per_hour": 3.6, "reference_engine": "torch"},
    })  # fmt: skip


def _csv(client, run_id, path):
    local = client.download_artifacts(run_id, path)
    return list(csv.DictReader(io.StringIO(open(local).read())))


def test_sweep_torch_engine_logged(bench_checkpoint, store):
    res = run_bench(config(bench_checkpoint, [{"name": "torch"}]), progress=False)
    (child,) = res.children
    assert child.error is None, child.error
    assert [p.offered_qps for p in child.points] == [4.0, 12.0]
    assert all(p.requests == 16 and p.failures == 0 for p in child.points)
    assert res.slo_ms == pytest.approx(5 * child.unloaded_p50_ms) and "unloaded p50 of torch" in res.slo_source
    if child.saturation_qps is not None:
        assert child.usd_per_1m == pytest.approx(1000.0 / child.saturation_qps)
        assert child.relative_cost == pytest.approx(0.0)  # torch is its own reference here

    run = store.get_run(child.run_id)
    t, m = run.data.tags, run.data.metrics
    assert run.info.status == "FINISHED"
    assert t[names.TAG_ENGINE] == "torch" and t[names.TAG_MODE] == "unconstrained" and t[names.TAG_DTYPE] == "float32"
    assert t[names.TAG_WORKLOAD] == "beam_search/p24/b4/n3/u" and t[names.TAG_CHECKPOINT] == str(bench_checkpoint)
    assert t["mlflow.parentRunId"] == res.parent_run_id
    hist = store.get_metric_history(child.run_id, names.OFFERED_RATE)
    assert sorted((h.step, h.value) for h in hist) == [(0, 4.0), (1, 12.0)]
    p99 = {h.step: h.value for h in store.get_metric_history(child.run_id, names.E2E_P99)}
    assert p99[0] > 0 and p99[1] > 0
    assert m["load/slo_ms"] == pytest.approx(res.slo_ms)
    assert child.grid_held_qps in (4.0, 12.0, None) and child.grid_broke_qps in (12.0, 4.0, None)  # offered rates
    assert (m.get(names.GRID_HELD), m.get(names.GRID_BROKE)) == (child.grid_held_qps, child.grid_broke_qps)
    recs = _csv(store, child.run_id, "records.csv")
    assert len(recs) == 2 + 3 + 32  # warm-up + unloaded + 2 points, every one recorded
    assert {r["phase"] for r in recs} == {"warmup", "unloaded", "load"}
    assert all(r["success"] == "True" and r["width"] == "4" for r in recs)
    arts = {a.path for a in store.list_artifacts(res.parent_run_id)}
    assert {"summary.csv", "points.csv", "latency_vs_qps.html", "cost_per_1m.html", "config.json"} <= arts


class FlakyEngine:
    """Wraps the real torch engine and fails every `k`-th request (a failing engine, not a mock)."""

    def __init__(self, inner, k: int):
        self.inner, self.k, self.n = inner, k, 0
        self.name = inner.name

    def _fails(self) -> bool:
        self.n += 1
        return self.n % self.k == 0

    async def beam_search(self, requests):
        if self._fails():
            return [BeamSearchResult(r.request_id, success=False, error="injected: worker crashed") for r in requests]
        return await self.inner.beam_search(requests)

    async def score(self, requests):
        if self._fails():
            raise ConnectionResetError("injected: connection reset")
        return await self.inner.score(requests)

    def capabilities(self):
        return self.inner.capabilities()

    async def close(self):
        await self.inner.close()


@pytest.mark.parametrize("workload", ["beam_search", "scoring"])
def test_failing_engine_counted_and_logged(bench_checkpoint, store, workload):
    from workbench.engines.registry import create_engine

    def factory(entry, ckpt):
        if entry.name == "sglang":  # not installable on CPU: let the real lookup fail
            return create_engine("sglang", checkpoint=ckpt)
        return FlakyEngine(create_engine("torch", checkpoint=ckpt), k=4)

    cfg = config(bench_checkpoint, [{"name": "torch", "label": "flaky"}, {"name": "sglang"}], workload=workload,
                 slo_ms=60000, warmup_requests=0, unloaded_requests=3)  # fmt: skip
    res = run_bench(cfg, engine_factory=factory, progress=False)
    flaky, sglang = res.children
    assert flaky.error is None, flaky.error
    total = sum(p.requests for p in flaky.points)
    assert total == 32 and all(p.not_sent == 0 for p in flaky.points)
    # requests 4, 8, ... of the engine's calls fail; 3 unloaded calls come first
    assert sum(p.failures for p in flaky.points) == len([n for n in range(4, 36) if n % 4 == 0])
    assert flaky.saturation_qps is None and math.isinf(flaky.usd_per_1m)  # failures: no point qualifies
    run = store.get_run(flaky.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["workbench.series"] == "flaky"
    fails = {h.step: h.value for h in store.get_metric_history(flaky.run_id, names.FAILURES)}
    assert sum(fails.values()) == sum(p.failures for p in flaky.points)
    recs = _csv(store, flaky.run_id, "records.csv")
    errors = {r["error"] for r in recs if r["success"] == "False"}
    reset = "ConnectionResetError: injected: connection reset"
    expected = "injected: worker crashed" if workload == "beam_search" else reset
    assert errors == {expected}

    assert sglang.error and "sglang" in sglang.error
    srun = store.get_run(sglang.run_id)
    assert srun.info.status == "FAILED" and "sglang" in srun.data.tags["workbench.error"]
    assert store.get_run(res.parent_run_id).info.status == "FINISHED"


def test_sweep_over_http_workbench_serve(bench_checkpoint, store):
    """The torch engine behind `workbench serve`, driven by the HTTP client: measured like external engines."""
    cfg = config(bench_checkpoint, [{"name": "torch", "transport": "http", "threads": 1}], rates=[6.0],
                 requests_per_rate=12)  # fmt: skip
    res = run_bench(cfg, progress=False)
    (child,) = res.children
    assert child.error is None, child.error
    assert child.transport == "http" and child.points[0].requests == 12 and child.points[0].failures == 0
    run = store.get_run(child.run_id)
    assert run.data.tags["workbench.transport"] == "http" and run.data.tags[names.TAG_MODE] == "unconstrained"
    recs = _csv(store, child.run_id, "records.csv")
    assert len(recs) == 2 + 3 + 12 and all(r["width"] == "4" for r in recs)
    # the server was stopped: its log came back as an artifact of the sweep
    logs = [a.path for a in store.list_artifacts(res.parent_run_id, "server_logs")]
    assert logs == ["server_logs/torch-server.log"]


def test_torch_variant_options_reach_the_server(bench_checkpoint, store):
    """`options: {quantize: int8}` on an http torch entry goes on the `workbench serve` command line (the server
    runs torch-int8), not into the HTTP client (which has no such knob)."""
    cfg = config(bench_checkpoint, [{"name": "torch", "transport": "http", "threads": 1, "options": {"quantize": "int8"}}],
                 rates=[6.0], requests_per_rate=6)  # fmt: skip
    res = run_bench(cfg, progress=False)
    (child,) = res.children
    assert child.error is None, child.error
    log = open(store.download_artifacts(res.parent_run_id, "server_logs/torch-server.log")).read()
    assert "engine torch-int8 (float32)" in log, log[-2000:]


@pytest.mark.parametrize("flags,want", [("avx2", "float32"), ("avx2 avx512f avx512_bf16", "bfloat16"),
                                        ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "bfloat16")])
def test_dtype_auto_follows_the_cpu(flags, want, monkeypatch):
    """`dtype: auto` is bf16 exactly where the CPU has bf16 instructions (AVX512-BF16 or AMX); the GPU-only
    engines are bf16 whatever the CPU; an explicit dtype is kept."""
    from workbench import hardware

    monkeypatch.setattr(hardware, "cpu_info", lambda: {"cpu_model": "test", "cpu_flags": flags})
    assert hardware.resolve_dtype("auto", "torch") == want
    assert hardware.resolve_dtype("auto", "sglang") == "bfloat16" == hardware.resolve_dtype("auto", "trtllm")
    assert hardware.resolve_dtype("float32", "torch") == "float32"
    assert hardware.resolve_dtype("bfloat16", "vllm") == "bfloat16"


def test_dtype_auto_is_resolved_and_logged(bench_checkpoint, store):
    """A sweep with `dtype: auto` runs and tags the dtype it resolved to on this CPU, beside what was asked."""
    from workbench.hardware import resolve_dtype

    res = run_bench(config(bench_checkpoint, [{"name": "torch", "dtype": "auto"}], rates=[4.0], requests_per_rate=6),
                    progress=False)
    (child,) = res.children
    assert child.error is None, child.error
    want = resolve_dtype("auto", "torch")
    assert child.dtype == want
    run = store.get_run(child.run_id)
    assert run.data.tags[names.TAG_DTYPE] == want and run.data.params["dtype_requested"] == "auto"
    assert run.data.tags[names.TAG_CPU]  # the CPU the resolution was made for


def test_random_checkpoints_are_cached_per_weights_version(data_dir, monkeypatch):
    """`random:<size>` is built once and cached; code that draws other weights (WEIGHTS_VERSION) gets a new one.
    The drawn RMSNorm weights differ from one another (all ones hid a norm applied in another's place)."""
    from transformers import AutoModelForCausalLM

    from workbench.config import LoadConfig
    from workbench.load import sources

    load = LoadConfig(checkpoints=["random:0.1m"], prompt_tokens=16)
    first = sources.resolve_checkpoint("random:0.1m", load)
    assert sources.resolve_checkpoint("random:0.1m", load) == first  # a cache hit
    monkeypatch.setattr(sources, "WEIGHTS_VERSION", sources.WEIGHTS_VERSION + 1)
    assert sources.resolve_checkpoint("random:0.1m", load) != first
    model = AutoModelForCausalLM.from_pretrained(first)
    norms = [m.weight.detach() for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert len(norms) >= 3 and all(float(w.min()) >= 0.5 and float(w.max()) <= 1.5 and float(w.std()) > 0.1
                                   for w in norms)
