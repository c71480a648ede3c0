"""`workbench microbench --floor`: FLOP accounting by phase and a real (tiny) run of the floor table.

No timing is asserted (shared, noisy machines): only that the accounting is right and every measured
number is present, positive and consistent with its parts.
"""

import json

import pytest

from workbench.engines.registry import create_engine
from workbench.perf.floorbench import flops
from workbench.perf.microbench import main as microbench_main
from workbench.testing import make_random_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_random_checkpoint(tmp_path_factory.mktemp("floor") / "ck", levels=(8, 8, 8, 8), vocab_base=1000,
                                  hidden_size=64, num_layers=2, num_attention_heads=2, num_key_value_heads=1)


def test_flops_by_phase_add_up(checkpoint):
    eng = create_engine("torch", checkpoint)
    try:
        lm = eng.lm
        P, B, T = 64, 6, 5
        fl = flops(lm, P, B, T)
    finally:
        eng.shutdown()
    w = lm.flops_per_token(0)
    assert fl["prefill_gemm"] == pytest.approx(w * P)
    assert fl["decode_gemm"] == pytest.approx(w * B * (T - 1))
    # attention: 4 * layers * heads * head_dim FLOPs per (query, key) pair; causal prefill sees half the square
    per_pair = 4 * len(lm.layers) * lm.n_heads * lm.head_dim
    assert fl["prefill_attention"] == pytest.approx(per_pair * P * P / 2)
    assert fl["decode_attention"] == pytest.approx(per_pair * B * sum(P + t for t in range(1, T)))
    assert fl["lm_head"] == pytest.approx(2 * lm.lm_head.numel() * (1 + B * (T - 1)))


def test_floor_table_runs_on_a_real_engine(checkpoint, capsys):
    rc = microbench_main(["--floor", "--quick", "--threads", "1", "--checkpoint", str(checkpoint),
                          "--prompt-len", "64", "--beam", "6", "--new-tokens", "5"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["requests"] == 4 and out["matmul_gflops"] > 0
    phases = {p["name"]: p for p in out["phases"]}
    assert set(phases) == {"prefill_gemm", "prefill_attention", "decode_gemm", "decode_attention", "lm_head"}
    assert all(p["kernel_ms"] > 0 and p["matmul_floor_ms"] > 0 for p in phases.values())
    assert out["matmul_floor_ms"] == pytest.approx(sum(p["matmul_floor_ms"] for p in phases.values()))
    assert out["kernel_floor_ms"] == pytest.approx(sum(p["kernel_ms"] for p in phases.values()))
    # the forwards are timed inside the request: what is left (selection, scheduling) cannot be negative
    assert out["engine_other_ms"] >= 0
    assert out["engine_prefill_forward_ms"] > 0 and out["engine_decode_forwards_ms"] > 0
    assert out["engine_over_matmul_floor"] == pytest.approx(out["engine_ms"] / out["matmul_floor_ms"])
