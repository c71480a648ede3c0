"""Load tests on a study's own trained checkpoints with its real test prompts, joined with its quality.

The tiny study of `workbench.testing.TINY_STUDY_OVERRIDES` (also notebook 02's test)
is trained and evaluated through the real pipeline into a temporary MLflow store; then
`workbench bench` replays each checkpoint's test prompts (`load.prompts_from: test_split`,
`trained:<method>` checkpoints) on the torch engine, constrained like evaluation, and the report's
join gives each load run its quality: the points of the quality-vs-cost Pareto plot.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import yaml

from workbench import names

pytestmark = pytest.mark.timeout(900)


def _study_yaml() -> dict:
    """experiments/quickstart.yaml with the shared tiny-study overrides, as one self-contained YAML."""
    from workbench.config import deep_merge
    from workbench.paths import REPO_ROOT
    from workbench.testing import TINY_STUDY_OVERRIDES

    base = yaml.safe_load((REPO_ROOT / "experiments" / "quickstart.yaml").read_text())
    return deep_merge(base, {**TINY_STUDY_OVERRIDES, "name": "bench_study", "split": {"max_history": 50}})


@pytest.fixture
def trained_study(tmp_path, data_dir, mlflow_store, one_torch_thread):
    if importlib.util.find_spec("recbole") is None:
        pytest.skip("MovieLens-100K ships in the recbole wheel: pip install --no-deps recbole==1.2.1")
    from workbench.config import load_config
    from workbench.study.pipeline import run_experiment

    path = tmp_path / "bench_study.yaml"
    path.write_text(yaml.safe_dump(_study_yaml()))
    run_experiment(load_config(path), path)
    return path


def test_test_split_load_on_trained_checkpoints_joins_quality(trained_study, tmp_path):
    from workbench.load.bench import run_bench
    from workbench.config import parse_config
    from workbench.load.cost import relative_cost
    from workbench.report.html import collect_study, default_quality_metric

    cfg = parse_config({
        "name": "bench_on_study", "engines": [{"name": "torch"}],
        "load": {"workload": "personalization", "study": str(trained_study), "prompts_from": "test_split",
                 "checkpoints": ["trained:soft_token", "trained:none"], "beam_width": 30, "max_new_tokens": 3,
                 "constrained": True, "rates": [4.0], "requests_per_rate": 12, "warmup_requests": 2,
                 "unloaded_requests": 3, "time_cap_s": 60},
        "cost": {"usd_per_hour": 3.6, "reference_engine": "torch", "reference_method": "none"},
    })  # fmt: skip
    res = run_bench(cfg, progress=False)
    assert [c.error for c in res.children] == [None, None]
    # the reference method's checkpoint is measured first whatever the listed order
    assert [c.method for c in res.children] == ["none", "soft_token"]
    none, soft = res.children
    if math.isfinite(none.usd_per_1m):
        assert none.relative_cost_method == 0.0
        assert soft.relative_cost_method == pytest.approx(relative_cost(soft.usd_per_1m, none.usd_per_1m), nan_ok=True)
    else:  # `none` never met the SLO: no finite reference cost
        assert math.isnan(soft.relative_cost_method)
    assert all(c.workload == "beam_search/test_split/b30/n3/c" and c.mode == "constrained" for c in res.children)
    assert all(c.saturation_qps is None or c.saturation_qps > 0 for c in res.children)

    study = collect_study(["bench_study", "bench_on_study"])
    q = default_quality_metric()
    joined = study.joined.set_index("method")
    # every load run found the quality run of its own checkpoint (same engine, mode, dtype)
    assert study.not_joined == []
    for method in ("none", "soft_token"):
        qrun = study.quality[(study.quality["method"] == method) & study.quality[q].notna()]
        assert len(qrun) == 1
        assert joined.loc[method, q] == pytest.approx(float(qrun[q].iloc[0]))
        assert joined.loc[method, "checkpoint"] == qrun[names.TAG_CHECKPOINT].iloc[0]
    # the load runs replayed the evaluated prompts: same measured lengths (soft token = none + the <|user|> slot)
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    lengths = {}
    for c in res.children:
        logged = client.get_run(c.run_id).data.metrics
        lengths[c.method] = logged[names.PROMPT_TOKENS_MEAN]
        # a NaN cost (the reference never met the SLO, e.g. on a busy machine) is not logged: MLflow takes finite values
        assert logged.get(names.COST_RELATIVE_METHOD, math.nan) == pytest.approx(c.relative_cost_method, nan_ok=True)
    assert joined.loc["soft_token", "relative_cost_method"] == pytest.approx(soft.relative_cost_method, nan_ok=True)
    evald = study.quality.set_index("method")[names.PROMPT_TOKENS_MEAN]
    assert lengths["none"] == pytest.approx(float(evald["none"]))
    assert lengths["soft_token"] == pytest.approx(lengths["none"] + 1)


def test_test_split_needs_a_study_and_a_trained_method(trained_study):
    from workbench.load.bench import run_bench
    from workbench.config import ConfigError, parse_config
    from workbench.study.outputs import StudyError

    base = {"name": "x",
            "load": {"workload": "personalization", "prompts_from": "test_split", "checkpoints": ["trained:none"]}}
    with pytest.raises(ConfigError, match="needs load.study"):
        parse_config(base)
    with pytest.raises(ConfigError, match="unknown method"):
        parse_config({**base, "load": {**base["load"], "study": str(trained_study), "checkpoints": ["trained:bogus"]}})
    cfg = parse_config({**base, "load": {**base["load"], "study": str(trained_study),
                                         "checkpoints": ["trained:user_sid"]}})
    with pytest.raises(StudyError, match="not trained"):
        run_bench(cfg, progress=False)
    # load.study_seed picks the seed of the trained:<method> checkpoints: the tiny study trained seed 0 only
    cfg = parse_config({**base, "load": {**base["load"], "study": str(trained_study), "study_seed": 5}})
    with pytest.raises(StudyError, match=r"'none' \(seed 5\) is not trained.*--seeds 5"):
        run_bench(cfg, progress=False)
