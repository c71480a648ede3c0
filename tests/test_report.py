"""The standalone HTML report from a real (temporary) MLflow store: figures, tables, the quality join."""

from __future__ import annotations

import html
import re

import pytest

from workbench import names
from workbench.report import html as report
from workbench.load.bench import run_bench
from workbench.config import parse_config
from workbench.tracking import start_run

pytestmark = pytest.mark.timeout(300)
RECALL10 = report.default_quality_metric()  # "quality/recall_at_10": MLflow refuses '@'


@pytest.fixture(scope="module")
def study(tmp_path_factory, bench_checkpoint, one_torch_thread):
    with pytest.MonkeyPatch.context() as mp:
        yield from _study(tmp_path_factory.mktemp("report"), mp, bench_checkpoint)


def _study(tmp_path, monkeypatch, ckpt):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path / "data"))
    cfg = parse_config({
        "name": "report_test", "tracking": {"experiment": "report_test"},
        "engines": [{"name": "torch"}, {"name": "hf"}],
        "load": {"workload": "beam_search", "checkpoints": [str(ckpt)], "prompt_tokens": 16, "beam_width": 4,
                 "max_new_tokens": 3, "rates": [3.0, 9.0], "requests_per_rate": 12, "warmup_requests": 1,
                 "unloaded_requests": 3, "slo_ms": 20000},
        "cost": {"usd_per_hour": 1.0, "reference_engine": "hf"},
    })  # fmt: skip
    res = run_bench(cfg, progress=False)
    assert all(c.error is None for c in res.children), [c.error for c in res.children]
    base = {names.TAG_STAGE: "evaluate", names.TAG_CHECKPOINT: str(ckpt), names.TAG_MODE: "unconstrained",
            names.TAG_METHOD: "none"}  # fmt: skip
    # quality measured on the torch engine in float32: joins the torch load run
    with start_run("evaluate/torch", experiment="report_test", tags={**base, names.TAG_ENGINE: "torch",
                                                                      names.TAG_DTYPE: "float32"}) as h:
        h.log_metrics({RECALL10: 0.25, names.metric_name(names.ndcg_at(10)): 0.12})
    # quality of the hf engine but in bfloat16: must NOT join the float32 hf load run
    with start_run("evaluate/hf-bf16", experiment="report_test", tags={**base, names.TAG_ENGINE: "hf",
                                                                        names.TAG_DTYPE: "bfloat16"}) as h:
        h.log_metrics({RECALL10: 0.24})
    yield res, ckpt, tmp_path


def test_report_standalone_with_figures(study):
    res, ckpt, tmp = study
    out = report.write_report("report_test", tmp / "reports" / "report_test.html")
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    # plotly.js embedded exactly once, no CDN: opens offline
    assert text.count("/**\n* plotly.js v") + text.count("* plotly.js v") >= 1
    assert "<script src=" not in text and '<link rel="stylesheet" href="http' not in text
    assert len(re.findall(r"plotly\.js v\d", text)) == 1
    n_plots = len(re.findall(r"Plotly\.newPlot\(", text))
    assert n_plots == 5, n_plots  # latency, throughput, cost, quality vs cost, quality vs p99
    for title in ("latency vs achieved QPS", "throughput vs offered rate", "cost per 1M requests",
                  "quality vs cost", "quality vs p99 latency"):  # fmt: skip
        assert title in text
    # tables, config, versions, commit
    assert "saturation_qps" in text and "usd_per_1m" in text
    plain = html.unescape(text)
    assert '"prompt_tokens": 16' in plain and '"mlflow"' in plain and "commit <code>" in text
    # the bf16 quality run was refused for the fp32 hf load run, with the reason
    assert "evaluate/hf-bf16: runs differ in workbench.dtype: 'float32' vs 'bfloat16'" in plain
    # every table scrolls inside its own box: the page never gets wider than the window
    assert ".tbl{overflow-x:auto" in text and text.count("<table") == text.count("<div class='tbl")
    # no performance runs here: no section for them, not even a count (the sweep's report is as before)
    assert "id='perf'" not in text and "performance run" not in text


def test_study_join_and_refusal(study):
    res, ckpt, _ = study
    s = report.collect_study("report_test")
    assert set(s.summary["engine"]) == {"torch", "hf"} and len(s.points) == 4
    j = s.joined.set_index("engine")[RECALL10]
    assert j["torch"] == pytest.approx(0.25) and j.isna()["hf"]
    assert any("hf" in n and "bfloat16" in n for n in s.not_joined)
    # hf is the cost reference: relative cost of hf is 0, torch's is stated against it
    rel = s.summary.set_index("engine")["relative_cost"]
    assert rel["hf"] == pytest.approx(0.0) or rel.isna()["hf"]
    a = s.summary.iloc[0]["tags"]
    with pytest.raises(report.IncomparableRuns, match="workbench.dtype"):
        report.check_joinable(a, {**a, names.TAG_DTYPE: "bfloat16"})
    with pytest.raises(report.IncomparableRuns, match="workbench.workload"):
        report.check_joinable(a, {**a, names.TAG_WORKLOAD: "scoring/p16/c5x3"}, report.COMPARE_TAGS)
    report.check_joinable(a, dict(a))  # identical tags join


def test_unknown_experiment_says_which_exist(study):
    with pytest.raises(ValueError, match="report_test"):
        report.collect_study("no_such_experiment")


def test_latest_reads_only_the_most_recent_sweep(study):
    _, ckpt, _ = study
    cfg = parse_config({
        "name": "latest", "tracking": {"experiment": "report_latest"},
        "engines": [{"name": "torch"}],
        "load": {"workload": "beam_search", "checkpoints": [str(ckpt)], "prompt_tokens": 16, "beam_width": 4,
                 "max_new_tokens": 3, "rates": [3.0], "requests_per_rate": 6, "warmup_requests": 1,
                 "unloaded_requests": 2, "slo_ms": 20000},
        "cost": {"usd_per_hour": 1.0, "reference_engine": "torch"},
    })  # fmt: skip
    first, second = run_bench(cfg, progress=False), run_bench(cfg, progress=False)
    every = report.collect_study("report_latest")
    assert sorted(every.summary["run_id"]) == sorted([first.children[0].run_id, second.children[0].run_id])
    assert len(every.parents) == 2
    latest = report.collect_study("report_latest", latest=True)
    assert list(latest.summary["run_id"]) == [second.children[0].run_id]
    assert [p["run_id"] for p in latest.parents] == [second.parent_run_id]
    assert set(latest.points["run_id"]) == {second.children[0].run_id}


def test_series_are_runs_and_lines_follow_the_x_axis():
    """Two sweeps of one engine in two dtypes: two lines and two bars (not one line, one stacked bar), each
    line joined along its x axis (past saturation the achieved rate drops: measurement order zig-zags)."""
    import pandas as pd

    runs = [{"run_id": f"r{dt}", "series": "torch", "engine": "torch", "method": "none", "workload": "wl",
             "mode": "unconstrained", "dtype": dt, "checkpoint": "/c/tiny", "transport": "inprocess",
             "status": "FINISHED",
             "slo_ms": 1000.0, "usd_per_1m": cost, "saturation_qps": 5.0, "sweep": sweep}
            for dt, cost, sweep in (("float32", 2.0, "sweep a"), ("bfloat16", 1.5, "sweep b"))]  # fmt: skip
    summary = pd.DataFrame(runs)
    points = pd.DataFrame([{"run_id": r["run_id"], "series": "torch", "engine": "torch", "method": "none",
                            "workload": "wl", "step": i, "offered_qps": off, "achieved_qps": ach,
                            "e2e_p50_ms": 10.0 + i, "e2e_p99_ms": 20.0 + i, "failures": 0}
                           for r in runs for i, (off, ach) in enumerate([(2, 2.0), (8, 5.5), (4, 4.0), (16, 5.0)])])
    s = report.Study("x", "sqlite://", summary, points, pd.DataFrame(), summary.copy())
    figs = report.figures(s)
    assert list(figs) == ["wl: latency vs achieved QPS", "wl: throughput vs offered rate", "wl: cost per 1M requests"]
    lat = figs["wl: latency vs achieved QPS"]
    series = sorted(t.name for t in lat.data if not t.name.startswith("SLO "))
    assert series == ["torch · bfloat16 p50", "torch · bfloat16 p99", "torch · float32 p50", "torch · float32 p99"]
    (slo,) = [t for t in lat.data if t.name.startswith("SLO ")]  # the SLO as a line in data units (load/plots.py)
    assert list(slo.y) == [1000.0, 1000.0] and list(slo.x) == [2.0, 5.5]  # across the achieved rates drawn
    for fig in (lat, figs["wl: throughput vs offered rate"]):
        for t in fig.data:
            assert list(t.x) == sorted(t.x), (t.name, list(t.x))
    bars = figs["wl: cost per 1M requests"].data
    assert sorted(x for t in bars for x in t.x) == ["torch · bfloat16", "torch · float32"]
    # two identical sweeps are told apart by the sweep; a label only says what differs
    from workbench.load.plots import series_labels

    same = summary.assign(dtype="float32")
    assert series_labels(same) == ["torch · sweep a", "torch · sweep b"]
    assert series_labels(summary.iloc[:1]) == ["torch"]


def test_ablation_table_of_a_study_without_signal_methods():
    """A study of `none` alone (as the ML-1M matrix's seed-0 run) has no ablation rows: an empty table, which the
    report turns into its note, not a KeyError that stops the whole report."""
    import pandas as pd

    from workbench.report import studies

    n10 = studies.N10
    table = pd.DataFrame([{"study": "s", "method": "popularity", n10: 0.018},
                          {"study": "s", "method": "none", n10: 0.146}])
    assert len(studies.ablation_rows(studies.StudyRuns(runs=[{}], table=table))) == 0
    table = pd.concat([table, pd.DataFrame([{"study": "s", "method": "soft_token", n10: 0.153},
                                            {"study": "s", "method": "soft_token/shuffled", n10: 0.150}])])
    rows = studies.ablation_rows(studies.StudyRuns(runs=[{}], table=table))
    assert list(rows["signal"]) == ["own", "shuffled"] and set(rows["method"]) == {"soft_token"}
