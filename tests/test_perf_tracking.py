"""Performance runs recorded like studies: each `workbench microbench` mode leaves one MLflow run, and the report
shows it.

Small real runs (a tiny random checkpoint, few requests, one thread) in a temporary real sqlite store: the
side-by-side default, `--floor --dtype both` and `--ab`, plus one into another experiment, one that fails and
one with `--no-track`. Checked: what each run holds (tags, params, the printed JSON as `perf.json`, the
headline metrics equal to the printed numbers) and what `workbench report --experiment perf` renders from it.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import re

import pytest

from workbench import names
from workbench.perf import record
from workbench.perf.microbench import main as microbench_main
from workbench.testing import make_random_checkpoint

pytestmark = pytest.mark.timeout(300)
SHAPE = ["--quick", "--threads", "1", "--prompt-len", "24", "--beam", "4", "--new-tokens", "5"]
SIDE_BY_SIDE = ["--concurrency", "4", "--candidates", "20", "--hf-candidates", "10"]


def _printed(text: str) -> list[dict]:
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]


@pytest.fixture(scope="module")
def perf(tmp_path_factory):
    """{mode: (printed JSON documents, run)} of one run per mode in a temporary store, and the store's client."""
    tmp = tmp_path_factory.mktemp("perf_tracking")
    ck = make_random_checkpoint(tmp / "ck", levels=(8, 8, 8, 8), vocab_base=1000, hidden_size=64, num_layers=2,
                                num_attention_heads=2, num_key_value_heads=1)
    argvs = {"microbench": [*SIDE_BY_SIDE], "floor": ["--floor", "--dtype", "both"],
             "ab": ["--ab", "gemm=default", "gemm=onednn"]}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp / 'mlflow.db'}")
        mp.setenv("WORKBENCH_MLRUNS_DIR", str(tmp / "mlruns"))
        from mlflow.tracking import MlflowClient

        printed, commands = {}, {}
        for mode, extra in argvs.items():
            argv = [*extra, *SHAPE, "--checkpoint", str(ck)]
            out = io.StringIO()  # capsys is function-scoped: this fixture is the module's
            with contextlib.redirect_stdout(out):
                assert microbench_main(argv) == 0
            printed[mode], commands[mode] = _printed(out.getvalue()), record.command_line(argv)
        with contextlib.redirect_stdout(io.StringIO()):
            microbench_main(["--ab", "gemm=default", "gemm=default", *SHAPE, "--checkpoint", str(ck),
                             "--experiment", "perf_elsewhere"])
            microbench_main(["--floor", *SHAPE, "--checkpoint", str(ck), "--no-track"])
            with pytest.raises(Exception):  # not a checkpoint: the run is recorded FAILED, with the error
                microbench_main(["--floor", *SHAPE, "--checkpoint", str(tmp)])
        client = MlflowClient()
        runs = client.search_runs([client.get_experiment_by_name(names.PERF_EXPERIMENT).experiment_id])
        by_command = {r.data.tags[names.TAG_COMMAND]: r for r in runs}
        yield {"printed": printed, "runs": {m: by_command[c] for m, c in commands.items()}, "all": runs,
               "client": client, "tmp": tmp, "ck": ck}


def test_each_mode_leaves_one_self_describing_run(perf):
    from workbench.hardware import cpu_info

    runs, client = perf["runs"], perf["client"]
    assert len(perf["all"]) == 4  # three modes and the failed one; --no-track and --experiment went elsewhere
    cpu = cpu_info()
    for mode, run in runs.items():
        t, p = run.data.tags, run.data.params
        assert run.info.status == "FINISHED"
        assert t[names.TAG_STAGE] == names.STAGE_PERF and t[names.TAG_PERF_MODE] == mode
        assert t[names.TAG_CPU].startswith(cpu["cpu_model"]) and t[names.TAG_GIT_COMMIT]
        assert t[names.TAG_THREADS] == "1" and t[names.TAG_CHECKPOINT] == str(perf["ck"])
        assert p["prompt_len"] == "24" and p["beam"] == "4" and p["mode"] == mode and "tracking_uri" not in p
        art = client.download_artifacts(run.info.run_id, record.ARTIFACT, str(perf["tmp"] / f"art_{mode}"))
        doc = json.loads(open(art).read())
        assert doc["mode"] == mode and doc["results"] == perf["printed"][mode]  # what it printed, as printed
        env = client.download_artifacts(run.info.run_id, "environment.json", str(perf["tmp"] / f"env_{mode}"))
        assert "torch" in json.loads(open(env).read())["versions"]
    assert runs["floor"].data.tags[names.TAG_DTYPE] == "float32,bfloat16"
    assert runs["microbench"].data.tags[names.TAG_DTYPE] == "float32"
    elsewhere = client.get_experiment_by_name("perf_elsewhere")
    assert elsewhere and len(client.search_runs([elsewhere.experiment_id])) == 1


def test_headline_metrics_are_the_printed_numbers(perf):
    side = perf["runs"]["microbench"].data.metrics
    (doc,) = perf["printed"]["microbench"]
    assert side[names.PERF_BEAM_SPEEDUP] == pytest.approx(doc["beam_speedup"])
    assert side[names.PERF_BEAM_MS] == pytest.approx(doc["beam_torch_s_per_req"] * 1000)
    assert side[names.PERF_SOFT_TOKEN_OVERHEAD] == pytest.approx(doc["soft_token_overhead"])
    floor = perf["runs"]["floor"].data.metrics
    for doc in perf["printed"]["floor"]:  # two dtypes in one run: one metric each
        assert floor[names.per_dtype(names.PERF_ENGINE_OVER_FLOOR, doc["dtype"])] == pytest.approx(
            doc["engine_over_matmul_floor"])
        assert floor[names.per_dtype(names.PERF_ENGINE_MS, doc["dtype"])] == pytest.approx(doc["engine_ms"])
    ab = perf["runs"]["ab"].data.metrics
    (doc,) = perf["printed"]["ab"]
    assert ab[names.PERF_B_OVER_A] == pytest.approx(doc["ratio_b_over_a"]["median"])
    assert ab[names.PERF_SAME_BEAMS_SHARE] == pytest.approx(doc["same_beams"] / doc["requests"])


def test_a_failed_run_keeps_its_error(perf):
    (failed,) = [r for r in perf["all"] if r.info.status != "FINISHED"]
    assert failed.info.status == "FAILED" and failed.data.tags[names.TAG_ERROR]


def test_report_shows_the_perf_runs(perf):
    from workbench.report.html import write_report

    text = write_report(names.PERF_EXPERIMENT, perf["tmp"] / "reports" / "perf.html").read_text()
    plain = html.unescape(text)
    assert "id='perf'" in text and "id='study'" not in text and "id='load'" not in text
    assert "4 performance run(s)" in plain
    table = plain[plain.index("id='perf-table'"):plain.index("id='perf-runs'")]
    rows = re.findall(r"<tr>(.*?)</tr>", table[table.index("<tbody>"):], flags=re.S)
    assert len(rows) == 5  # side by side, floor float32 + bfloat16, ab, and the failed run
    floor_rows = [r for r in rows if "<td>floor</td>" in r and "FINISHED" in r]
    assert [("<td>float32</td>" in r, "<td>bfloat16</td>" in r) for r in floor_rows] == [(True, False), (False, True)]
    for mode in names.PERF_MODES:  # (trainbench's modes: tests/test_trainbench.py)
        ms, vs, ratio, what = record.SUMMARY[mode]
        row = next(r for r in rows if f"<td>{mode}</td>" in r and "FINISHED" in r)  # floor: its float32 row
        doc = perf["printed"][mode][0]
        assert what in row and perf["runs"][mode].data.tags[names.TAG_COMMAND] in row
        assert f"{record.headline(mode, doc)[ratio]:.4g}" in row  # the ratio the run printed
    assert sum("FAILED" in r for r in rows) == 1
    assert "perf: engine time vs compute floor, by phase" in text and "perf: A/B per-request ratio" in text
    assert text.count("Plotly.newPlot(") == 2


def test_floor_figure_stacks_what_the_run_printed(perf):
    from workbench.report import html as report

    s = report.collect_study(names.PERF_EXPERIMENT)
    fig = report.figures(s)["perf: engine time vs compute floor, by phase"]
    docs = perf["printed"]["floor"]
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"engine: prefill forward", "engine: decode forwards", "engine: selection / scheduling",
                            "prefill_gemm", "prefill_attention", "decode_gemm", "decode_attention", "lm_head"}
    engine = [sum(by_name[n].y[i] for n in by_name if n.startswith("engine:")) for i in range(len(docs))]
    assert engine == pytest.approx([d["engine_ms"] for d in docs])  # the parts add up to the request
    n = len(docs)
    kernels = [sum(by_name[p].y[i] for p in by_name if not p.startswith("engine:")) for i in range(n)]
    matmul = [sum(by_name[p].y[n + i] for p in by_name if not p.startswith("engine:")) for i in range(n)]
    assert kernels == pytest.approx([d["kernel_floor_ms"] for d in docs])
    assert matmul == pytest.approx([d["matmul_floor_ms"] for d in docs])


def test_every_mode_has_a_runner_and_headlines():
    from workbench.perf import microbench, trainbench

    assert set(microbench.RUNNERS) == set(names.PERF_MODES)
    assert set(trainbench.RUNNERS) == set(names.TRAIN_PERF_MODES)
    assert set(names.PERF_MODES + names.TRAIN_PERF_MODES) == set(record.HEADLINES) == set(record.SUMMARY)


def test_side_by_side_names_its_device(perf):
    """The side-by-side JSON names the device it ran on by its model (the GPU's on CUDA), not only the CPU."""
    from workbench.hardware import cpu_info

    (doc,) = perf["printed"]["microbench"]
    assert doc["device"] == "cpu" and doc["device_name"] == cpu_info()["cpu_model"]
    assert doc["workload"]["constrained"] is True  # the default; --no-constrained frees it
