"""`workbench microbench --floor`: FLOP accounting by phase and a real (tiny) run of the floor table.

No timing is asserted (shared, noisy machines): only that the accounting is right and every measured
number is present, positive and consistent with its parts. Each run records an MLflow run in a temporary
store (`mlflow_store`); what it records is checked in test_perf_tracking.py.
"""

import json

import pytest

from workbench.engines.registry import create_engine
from workbench.perf.floorbench import flops
from workbench.perf.microbench import main as microbench_main
from workbench.testing import make_random_checkpoint


# The checkpoint below: hidden 64, 2 layers, 2 query heads of 32, 1 KV head of 32, MLP 192 (3 x hidden).
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, MLP = 64, 2, 2, 1, 32, 192


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_random_checkpoint(tmp_path_factory.mktemp("floor") / "ck", levels=(8, 8, 8, 8), vocab_base=1000,
                                  hidden_size=HIDDEN, num_layers=LAYERS, num_attention_heads=HEADS,
                                  num_key_value_heads=KV_HEADS)


def test_flops_by_phase_match_hand_counts(checkpoint):
    """FLOPs by phase against numbers derived by hand from the config, not from the engine's own formula."""
    eng = create_engine("torch", checkpoint)
    try:
        fl = flops(eng.lm, prompt_len=64, beam=6, new_tokens=5)
    finally:
        eng.shutdown()
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]  # the HF config's, with SID tokens
    # Matmul weights per layer: q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12,288; gate, up, down 3 x 64x192 = 36,864.
    # 2 layers: 98,304 weights, 2 FLOPs each (multiply + add) = 196,608 FLOPs per token.
    assert HIDDEN * HEADS * HEAD_DIM * 2 + HIDDEN * KV_HEADS * HEAD_DIM * 2 + 3 * HIDDEN * MLP == 49_152
    per_token = 196_608
    assert fl["prefill_gemm"] == pytest.approx(per_token * 64)  # 12,582,912: every prompt token
    assert fl["decode_gemm"] == pytest.approx(per_token * 6 * 4)  # 4,718,592: 6 beams x 4 decode steps
    # Attention per (query, key) pair: q.k and p.v, 2 x 32 FLOPs each, per head per layer: 4 x 2 x 2 x 32 = 512.
    # Causal prefill: query t attends keys 0..t, 64 x 65 / 2 = 2,080 pairs; decode step t: 6 beams over 64 + t keys.
    assert fl["prefill_attention"] == pytest.approx(512 * 2_080)  # 1,064,960
    assert fl["decode_attention"] == pytest.approx(512 * 6 * (65 + 66 + 67 + 68))  # 817,152
    # lm_head: a 64 x vocab GEMM for the prompt's last row, then for 6 beams at each of 4 decode steps.
    assert fl["lm_head"] == pytest.approx(2 * 64 * vocab * (1 + 6 * 4))


def test_floor_table_runs_on_a_real_engine(checkpoint, capsys, mlflow_store):
    rc = microbench_main(["--floor", "--quick", "--threads", "1", "--checkpoint", str(checkpoint),
                          "--prompt-len", "64", "--beam", "6", "--new-tokens", "5"])
    assert rc == 0
    text = capsys.readouterr().out
    (out,) = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
    assert "floor summary on " in text and f"| {out['engine']} | float32 |" in text
    assert out["requests"] == 4 and out["matmul_gflops"] > 0
    phases = {p["name"]: p for p in out["phases"]}
    assert set(phases) == {"prefill_gemm", "prefill_attention", "decode_gemm", "decode_attention", "lm_head"}
    assert all(p["kernel_ms"] > 0 and p["matmul_floor_ms"] > 0 for p in phases.values())
    assert out["matmul_floor_ms"] == pytest.approx(sum(p["matmul_floor_ms"] for p in phases.values()))
    assert out["kernel_floor_ms"] == pytest.approx(sum(p["kernel_ms"] for p in phases.values()))
    # the forwards are timed inside the request: what is left (selection, scheduling) cannot be negative
    assert out["engine_other_ms"] >= 0
    assert out["engine_prefill_forward_ms"] > 0 and out["engine_decode_forwards_ms"] > 0
    # each request over the floor at the matmul rate sampled around it; the headline ratio is their median
    per = out["per_request"]
    assert len(per) == 4 and all(r["matmul_gflops"] > 0 for r in per)
    ratios = sorted(r["engine_ms"] / (out["gflop"] / r["matmul_gflops"] * 1e3) for r in per)
    assert out["engine_over_matmul_floor"] == pytest.approx(ratios[len(ratios) // 2])
    assert out["paired_ratio_range"] == pytest.approx([ratios[0], ratios[-1]])
    rates = sorted(r["matmul_gflops"] for r in per)
    assert out["matmul_gflops"] == pytest.approx(rates[len(rates) // 2])
    from workbench.hardware import cpu_info

    assert out["device"] == "cpu" and out["device_name"] == cpu_info()["cpu_model"]  # the device, by its model


@pytest.mark.parametrize("flag,want", [([], True), (["--no-constrained"], False), (["--constrained"], True)])
def test_side_by_side_constrains_only_when_asked(checkpoint, flag, want):
    """The side-by-side beam workload is constrained by default (the recorded runs') and free with
    --no-constrained: the flag reaches the requests, not only the JSON."""
    from workbench.perf.microbench import SideBySide, parse

    args = parse(["--checkpoint", str(checkpoint), *flag])
    req = SideBySide.of(args, checkpoint).beam_workload.request(0)
    assert args.constrained is want and req.constrained is want


def test_floor_runs_both_dtypes_side_by_side(checkpoint, capsys, mlflow_store):
    """`--dtype both`: float32 then bfloat16 in one run, each against its own matmul rate, one summary table
    naming the CPU."""
    from workbench.hardware import cpu_info

    rc = microbench_main(["--floor", "--quick", "--threads", "1", "--checkpoint", str(checkpoint), "--dtype", "both",
                          "--prompt-len", "32", "--beam", "4", "--new-tokens", "5"])
    assert rc == 0
    text = capsys.readouterr().out
    outs = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
    assert [o["dtype"] for o in outs] == ["float32", "bfloat16"]
    assert all(o["engine_ms"] > 0 and o["matmul_gflops"] > 0 for o in outs)
    assert f"floor summary on {cpu_info()['cpu_model']}" in text
    assert "| torch | float32 |" in text and "| torch | bfloat16 |" in text


def test_ab_runs_two_engines_on_the_same_requests(checkpoint, capsys, mlflow_store):
    """`--ab A B`: both engines, the same requests alternating; the ratio and the same-beams count come from the
    per-request rows. bf16 default vs packed oneDNN GEMMs give the same beams bit for bit (torch/onednn.py)."""
    from workbench.engines.torch import onednn as torch_onednn

    dtype = "bfloat16" if torch_onednn.bf16_supported() else "float32"
    rc = microbench_main(["--ab", "gemm=default", f"gemm=onednn,dtype={dtype}", "--dtype", dtype, "--quick",
                          "--threads", "1", "--checkpoint", str(checkpoint), "--prompt-len", "40", "--beam", "6",
                          "--new-tokens", "5"])
    assert rc == 0
    (out,) = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    assert out["a"] == {"dtype": dtype, "gemm": "default"}  # --dtype is A's, which names none
    rows = out["per_request"]
    assert out["requests"] == len(rows) == 6
    assert out["a_engine"]["gemm"] == "default" and out["b_engine"]["gemm"] == "onednn"
    ratios = sorted(r["b_ms"] / r["a_ms"] for r in rows)
    assert out["ratio_b_over_a"]["median"] == pytest.approx((ratios[2] + ratios[3]) / 2)
    assert out["ratio_b_over_a"]["q1"] <= out["ratio_b_over_a"]["median"] <= out["ratio_b_over_a"]["q3"]
    assert out["same_beams"] == sum(r["same_beams"] for r in rows)
    if dtype == "bfloat16":
        assert out["same_beams"] == 6


def test_ab_options_are_checked():
    from workbench.errors import UsageError
    from workbench.perf.abbench import parse_options

    assert parse_options("gemm=default, dtype=bfloat16,compile=true") == {"gemm": "default", "dtype": "bfloat16",
                                                                          "compile": True}
    assert parse_options("") == {}
    for bad in ("gemm=mkl", "threads=2", "dtype"):
        with pytest.raises(UsageError, match="is not one of"):
            parse_options(bad)
    with pytest.raises(UsageError, match="--dtype both is for --floor"):  # before any checkpoint is built
        microbench_main(["--ab", "gemm=default", "gemm=onednn", "--dtype", "both"])
