"""scripts/validate_gpu_engines.sh and its Python side (workbench/load/gpu_validation.py), as far as a
machine without a GPU can run them:

- the dry run checks the host for real (here: "no GPU", named with the fix), prints every environment,
  parity and bench step it would run (TensorRT-LLM's install the documented way: torch cu130 first, then
  the wheel with NVIDIA's index), notices a half-built environment, and exits 0;
- the table and its exit rule run on real results: the hf engine's parity report against the torch
  engine and a real small load sweep (`run_engine`), then the same results with one case failed.

Fault injection (done once while writing this, then reverted): `_cell` counting a failed case as good
failed `test_table_passes_and_fails_on_real_results`; the script without its half-built check failed the
repair test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from workbench.load import gpu_validation as gv

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "validate_gpu_engines.sh"

pytestmark = pytest.mark.timeout(600)


def _dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_dry_run_checks_the_host_and_prints_every_step():
    r = _dry_run()
    assert r.returncode == 0, r.stderr
    out = r.stdout
    if shutil.which("nvidia-smi") is None:
        assert "[missing] gpu" in out and "no GPU" in out
        assert "vllm: blocked by gpu" in out
    for env in ("vllm-cuda", "sglang", "trtllm"):
        assert f".venvs/{env}/bin/python -m pip install" in out
    assert "torch==2.9.1 torchvision --index-url $TORCH_CUDA_INDEX_URL" in out
    assert "--extra-index-url $TRTLLM_EXTRA_INDEX_URL -r environments/trtllm.txt" in out
    assert out.index("torch==2.9.1") < out.index("environments/trtllm.txt")  # the guide's order
    for e in gv.ENGINES:
        assert f"workbench engines validate {e} --checkpoint" in out
    assert out.count("--dtype float32") == 3 and out.count("--dtype bfloat16") == 3  # both parity passes
    table = (REPO / "reports/gpu_validation/table.md").read_text()
    assert all(f"| {e} | dry run |" in table for e in gv.ENGINES)
    host = json.loads((REPO / "reports/gpu_validation/host.json").read_text())
    assert set(host["blocked"]) == set(gv.ENGINES)


def test_dry_run_one_engine_and_bad_argument():
    r = _dry_run("sglang")
    assert r.returncode == 0
    assert ".venvs/sglang" in r.stdout and ".venvs/trtllm" not in r.stdout
    bad = subprocess.run(["bash", str(SCRIPT), "--dry-run", "tensorrt"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument 'tensorrt'" in bad.stderr


def test_half_built_environment_is_repaired():
    d = REPO / ".venvs" / "sglang"
    if d.exists():
        pytest.skip(".venvs/sglang exists here; not touching a real environment")
    d.mkdir(parents=True)
    try:
        r = _dry_run("sglang")
    finally:
        shutil.rmtree(d)
    assert r.returncode == 0
    assert "exists without its stamp" in r.stdout and "repaired" in r.stdout


def test_host_checks_name_what_is_missing():
    checks = gv.host_checks(("trtllm",))
    names = {c.name for c in checks}
    assert {"gpu", "python_trtllm", "cuda_home", "openmpi", "torch_cuda_index_url"} <= names
    assert "glibc" not in names  # the manylinux_2_34 limit is the sglang wheel's
    assert "glibc" in {c.name for c in gv.host_checks(("sglang",))}
    for c in checks:
        assert c.status in ("ok", "missing", "warn") and c.detail
    if shutil.which("nvidia-smi") is None:
        assert gv.blocked_engines(checks, ("trtllm",))["trtllm"][0] == "gpu"


@pytest.fixture(scope="module")
def hf_result(tmp_path_factory):
    """A real `run_engine` on the hf engine (parity vs torch, then the small load sweep) in float32."""
    import os

    from workbench.testing import make_random_checkpoint

    tmp = tmp_path_factory.mktemp("gpuval")
    ck = make_random_checkpoint(tmp / "ck", n_items=30, levels=(4, 4), hidden_size=32, num_layers=1,
                                num_attention_heads=2, head_dim=16, vocab_base=50)
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
    try:
        cfg = gv.bench_config("hf", str(ck), "float32")
        cfg["load"].update(prompt_tokens=16, beam_width=2, requests_per_rate=6, max_rates=2, warmup_requests=1,
                           unloaded_requests=2, time_cap_s=20)
        orig = gv.bench_config
        gv.bench_config = lambda *a, **k: cfg
        try:
            res = gv.run_engine("hf", str(ck), tmp / "out", dtype="float32")
        finally:
            gv.bench_config = orig
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old
    return tmp / "out", res


def test_table_passes_and_fails_on_real_results(hf_result):
    out, res = hf_result
    assert set(res["parity"]) == {"float32", "bfloat16"} and res["parity_ok"], res["parity"]
    # the float32 pass is the strict one: its tolerance is orders tighter than bf16's
    assert res["parity"]["float32"]["tol"] < 1e-2 * res["parity"]["bfloat16"]["tol"]
    assert res["bench"]["ok"] and res["bench"]["saturation_qps"] > 0, res["bench"]
    (out / "env_hf.json").write_text(json.dumps({"status": "present", "detail": "core env"}))
    md, ok = gv.table(out, ("hf",))
    assert ok, md
    assert "| hf | present | f32 pass (" in md and "; bf16 pass (" in md and "FAIL" not in md
    # one case failed -> FAIL in its cell and exit status not ok
    bad = json.loads((out / "hf.json").read_text())
    bad["parity"]["float32"]["cases"][0]["status"] = "failed"
    (out / "hf.json").write_text(json.dumps(bad))
    md, ok = gv.table(out, ("hf",))
    assert not ok and "FAIL" in md
    # an environment that did not build -> not ok whatever the cases say
    (out / "hf.json").write_text(json.dumps(res))
    (out / "env_hf.json").write_text(json.dumps({"status": "failed", "detail": "pip"}))
    assert not gv.table(out, ("hf",))[1]


class PrefixedLabelEngine:
    """The real torch engine whose label scores also condition on one token before each item, as SGLang's
    multi-item scoring does with its delimiter placeholder (remote/sglang.label_candidate_prefix)."""

    def __init__(self, inner, prefix: tuple[int, ...], declare: bool):
        self.inner, self.prefix, self.name = inner, prefix, "prefixed"
        if declare:
            self.label_candidate_prefix = prefix

    async def score(self, requests):
        from workbench.engines.base import ScoreRequest

        out = [ScoreRequest(r.prompt, tuple(self.prefix + tuple(c) for c in r.candidates), mode=r.mode,
                            label_token_ids=r.label_token_ids) if r.mode == "label" else r for r in requests]
        return await self.inner.score(out)

    def __getattr__(self, k):
        return getattr(self.inner, k)


@pytest.mark.parametrize("declare", [True, False])
def test_parity_compares_label_scores_with_the_engines_own_conditioning(declare, tmp_path):
    """An engine that declares the token its label scores condition on before each item passes label parity
    (the oracle scores prefix + item); the same engine without the declaration fails it."""
    import asyncio

    from workbench.engines.parity import compare_engines
    from workbench.engines.registry import create_engine
    from workbench.testing import make_random_checkpoint

    ck = make_random_checkpoint(tmp_path / "ck", n_items=30, levels=(4, 4), hidden_size=32, num_layers=1,
                                num_attention_heads=2, head_dim=16, vocab_base=50)

    async def go():
        eng = PrefixedLabelEngine(create_engine("torch", checkpoint=ck), (7,), declare)
        oracle = create_engine("torch", checkpoint=ck)
        try:
            return await compare_engines(eng, oracle, ck)
        finally:
            await eng.inner.close()
            await oracle.close()

    cases = {c.name: c for c in asyncio.run(go()).cases}
    assert cases["score_sequence"].status == "passed"  # sequence mode has no prefix either side
    want = "passed" if declare else "failed"
    assert cases["score_label"].status == want, cases["score_label"]
    if declare:
        assert "oracle items prefixed with [7]" in cases["score_label"].detail
