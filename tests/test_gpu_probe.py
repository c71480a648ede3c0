"""The GPU probe (scripts/gpu_probe.sh, workbench/perf/gpu_probe.py), run here on the CPU: `--cpu-smoke` through the
script in a subprocess (every phase at tiny sizes), an injected deadline, `--plan`, the GPU mode without CUDA, and
the JSON document rewritten valid after every phase (with stand-in phases, in this process).

What a GPU host will run is the same code at other sizes; what only a GPU can show (its rates, the CUDA kernels)
waits for one. The subprocess runs check what the bare GPU image requires: no MLflow, FastAPI or plotly imported
(the probe records the third-party modules it imported), at most 8 files with plain names.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.perf import gpu_probe

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_probe.sh"
# what workbench itself depends on but the GPU image lacks (transformers may import others where installed)
NOT_ON_THE_IMAGE = ("mlflow", "fastapi", "plotly", "uvicorn", "pydantic", "prometheus_client", "sentence_transformers",
                    "implicit", "starlette")
PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

pytestmark = pytest.mark.timeout(180)


def _script(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script sets it to this repository
    env["PYTHON"] = sys.executable
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=170)


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_probe") / "out"
    r = _script("--cpu-smoke", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, json.loads((out / gpu_probe.JSON_FILE).read_text()), r


def test_cpu_smoke_runs_every_phase(smoke):
    out, doc, _ = smoke
    assert doc["mode"] == "cpu-smoke" and doc["schema"] == gpu_probe.SCHEMA
    phases = doc["phases"]
    assert list(phases) == [p.name for p in gpu_probe.PHASES]
    for name, ph in phases.items():
        assert ph["status"] in ("ok", "skipped"), (name, ph.get("reason"), ph.get("traceback"))
        assert ph["status"] == "ok" or ph["reason"], name  # a skipped phase says why
    assert phases["device"]["status"] == "ok" and doc["elapsed_s"] <= 60
    res = {n: ph["result"] for n, ph in phases.items() if ph["status"] == "ok"}
    assert res["device"]["gemm_tflops"] > 0 and min(res["device"][f"copy_{d}_gb_s"] for d in ("h2d", "d2h", "d2d")) > 0
    if "parity" in res:
        assert res["parity"]["ok"] and {c["status"] for c in res["parity"]["bfloat16"]["cases"]} == {"passed"}
    if "seeds_shape" in res:
        seeds = res["seeds_shape"]
        assert seeds["predicted"]["floor_ms"] > 0 and seeds["unconstrained"]["e2e_ms"]["p50"] > 0
        assert seeds["constrained"]["e2e_ms"]["n"] == gpu_probe.SMOKE.unloaded_requests
    if "sweep" in res:
        assert len(res["sweep"]["points"]) == len(gpu_probe.SMOKE.sweep_fractions) and res["sweep"]["slo_ms"] > 0
    if "training" in res:
        assert res["training"]["tokens_per_s"] > 0


def test_the_prediction_is_on_disk_before_its_measurement(tmp_path, monkeypatch):
    """The seeds' shape at smoke size, in this process: when the first timed request starts, probe.json already
    holds the predicted floor (so the run tests a prediction made before it)."""
    from workbench.perf import floorbench

    seen = []
    timed = floorbench.engine_times

    def engine_times(*a, **k):
        seen.append(json.loads((tmp_path / gpu_probe.JSON_FILE).read_text())["phases"]["seeds_shape"])
        return timed(*a, **k)

    monkeypatch.setattr(floorbench, "engine_times", engine_times)
    phases = [p for p in gpu_probe.PHASES if p.name in ("device", "seeds_shape")]
    doc = gpu_probe.Probe(gpu_probe.SMOKE, tmp_path, phases, deadline_s=120).run()
    assert doc["phases"]["seeds_shape"]["status"] == "ok", doc["phases"]["seeds_shape"]
    (before,) = seen
    assert before["status"] == "running" and before["result"]["predicted"]["floor_ms"] > 0
    assert "unconstrained" not in before["result"]  # nothing measured yet
    assert before["result"]["predicted"] == doc["phases"]["seeds_shape"]["result"]["predicted"]


def test_smoke_imports_nothing_the_gpu_image_lacks_and_writes_few_plain_files(smoke):
    out, doc, _ = smoke
    imported = set(doc["third_party_modules"])
    assert {"torch", "transformers", "numpy"} <= imported  # the list is real: the ones it needs are there
    assert not imported & set(NOT_ON_THE_IMAGE), imported & set(NOT_ON_THE_IMAGE)
    names = _files(out)
    assert names == [gpu_probe.JSON_FILE, gpu_probe.LOG_FILE] and len(names) <= 8
    assert all(PLAIN_NAME.match(n) for n in names)


def test_an_injected_deadline_skips_the_phases_that_would_not_fit(tmp_path):
    """Deadline 3 s: every phase after `device` estimates more than is left, or needs one that was skipped."""
    r = _script("--cpu-smoke", str(tmp_path / "out"), "--deadline-s", "3")
    assert r.returncode == 0, r.stderr[-3000:]
    phases = json.loads((tmp_path / "out" / gpu_probe.JSON_FILE).read_text())["phases"]
    assert phases["device"]["status"] in ("ok", "skipped")
    assert phases["parity"]["status"] == "skipped" and phases["parity"]["reason"].startswith("deadline:")
    for name in list(phases)[1:]:
        ph = phases[name]
        assert ph["status"] == "skipped", (name, ph)
        assert ph["reason"].startswith(("deadline:", "needs phase")), (name, ph["reason"])
    assert "skipped (deadline:" in r.stdout


def test_plan_prints_the_estimates_without_importing_torch():
    r = subprocess.run([sys.executable, "-c", "import sys; from workbench.perf import gpu_probe; "
                        "gpu_probe.main(['--plan']); print('torch imported:', 'torch' in sys.modules)"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "torch imported: False" in r.stdout
    for ph in gpu_probe.PHASES:
        assert f"\n{ph.name} " in r.stdout
    total = sum(gpu_probe.GPU.estimates.values())
    assert f"{total:.0f}" in r.stdout and total <= gpu_probe.GPU.deadline_s
    assert set(gpu_probe.GPU.estimates) == set(gpu_probe.SMOKE.estimates) == {p.name for p in gpu_probe.PHASES}


def test_the_gpu_mode_without_cuda_says_what_to_run(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU mode would run")
    r = _script(str(tmp_path / "out"))
    assert r.returncode == 2 and "sees no CUDA device" in r.stderr and "--cpu-smoke" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_the_json_is_valid_after_every_phase(tmp_path):
    """Stand-in phases read probe.json as they start: the phases before them are there, finished, in valid JSON;
    a phase that raises is an error with its message, the next phases run, one that needs it is skipped."""
    seen: dict[str, dict] = {}

    def reader(name: str, result: dict | None = None, fail: bool = False):
        def run(probe):
            seen[name] = json.loads((tmp_path / gpu_probe.JSON_FILE).read_text())  # strict JSON, as written
            if fail:
                raise RuntimeError("out of memory, say")
            return result or {}

        return run

    phases = [gpu_probe.Phase("a", "first", reader("a", {"x": float("nan"), "y": 2})),
              gpu_probe.Phase("b", "second", reader("b", fail=True)),
              gpu_probe.Phase("c", "needs b", reader("c"), needs=("b",)),
              gpu_probe.Phase("d", "last", reader("d", {"z": 3}))]
    shape = gpu_probe.ProbeShape(mode="test", device="cpu", size="0.1m", estimates={n: 0 for n in "abcd"})
    doc = gpu_probe.Probe(shape, tmp_path, phases, deadline_s=60).run()
    assert seen["a"]["phases"]["a"]["status"] == "running" and seen["a"]["phases"]["b"]["status"] == "pending"
    assert seen["b"]["phases"]["a"]["status"] == "ok" and seen["b"]["phases"]["a"]["result"] == {"x": None, "y": 2}
    assert "c" not in seen  # skipped: b failed
    assert seen["d"]["phases"]["b"]["status"] == "error" and "out of memory" in seen["d"]["phases"]["b"]["reason"]
    assert seen["d"]["phases"]["c"] == {**seen["d"]["phases"]["c"], "status": "skipped",
                                        "reason": "needs phase b, which did not run (error)"}
    final = json.loads((tmp_path / gpu_probe.JSON_FILE).read_text())
    assert [final["phases"][n]["status"] for n in "abcd"] == ["ok", "error", "skipped", "ok"] == \
        [doc["phases"][n]["status"] for n in "abcd"]
    assert _files(tmp_path) == [gpu_probe.JSON_FILE, gpu_probe.LOG_FILE]  # no temporary file left
