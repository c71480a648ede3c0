"""Context variants (`methods.contexts`, workbench/study/methods/variants.py): one method at several prompt lengths,
each its own trained model, named `<method>-k<items>`.

The name (one spelling, valid for MLflow and as a file name), the derived method and its prompt, the config's
checks, the train cache key (a variant's differs from its method's by its context alone; the method at its own
context keeps its key), the same-context references, and a tiny study with variants through the real pipeline:
their rows, prompt lengths, the comparison with `none` at the same context, their MLflow runs and the
quality-vs-prompt-length figure with one line per method.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import yaml

from workbench import names
from workbench.config import ConfigError, parse_config
from workbench.sids.layout import SidLayout, add_dedup_digit
from workbench.study import methods
from workbench.study.prompts import PromptBuilder

pytestmark = pytest.mark.timeout(600)
MINIMAL = {"name": "t", "dataset": {"name": "ml-100k"}}


# ---- the name ---------------------------------------------------------------------------------------------


def test_the_name_round_trips_and_mlflow_takes_it():
    from mlflow.utils.validation import _validate_metric_name, _validate_param_name, _validate_run_id  # noqa: F401

    assert names.context_variant("none", 5) == "none-k5"
    assert names.split_context_variant("none-k5") == ("none", 5)
    assert names.split_context_variant("text_history-k20") == ("text_history", 20)
    for other in ("none", "none_long", "none-k05", "none-k", "-k5", "none-kx"):  # not the spelling: not a variant
        assert names.split_context_variant(other) == (other, None)
    for name in ("none-k5", "soft_token-k5/shuffled"):  # as MLflow metric / param keys and run names take it
        _validate_metric_name(f"{name}/seed0")
        _validate_param_name(name)
    assert not "none-k5".isidentifier()  # so no registered method can be named like a variant


# ---- the derived method and its prompt --------------------------------------------------------------------

CODES = add_dedup_digit(np.stack([np.arange(12) % 4, np.arange(12) // 4], 1))
LAYOUT = SidLayout(base_vocab_size=100, item_codebooks=(4, 4), dedup_size=int(CODES[:, -1].max()) + 1)
SIDS = LAYOUT.item_codes_to_ids(CODES)


def test_get_derives_the_variant_from_its_method():
    v = methods.get("text_history-k3")
    assert type(v) is type(methods.get("text_history")) and v.context == 3 and v.needs_text
    assert methods.get("soft_token-k2").signal == methods.VECTOR and methods.get("none-k2").name == "none-k2"
    hist = [3, 7, 1, 4]
    short = PromptBuilder("none-k2", LAYOUT, SIDS, recent_k=3, long_m=5).build(hist)[0]
    base = PromptBuilder("none", LAYOUT, SIDS, recent_k=3, long_m=5)
    assert short == [base.HIST, *SIDS[1], *SIDS[4]] and base.build(hist)[0] == [base.HIST, *SIDS[[7, 1, 4]].ravel()]
    with pytest.raises(methods.UnknownMethod, match="unknown method 'bogus-k3'.*context variants"):
        methods.get("bogus-k3")
    with pytest.raises(methods.UnknownMethod, match=">= 1 history items, got 0"):
        methods.get("none-k0")
    with pytest.raises(ValueError, match="context variant's name"):
        methods.register(methods.Method("none-k5", "x", context=5))
    with pytest.raises(ValueError, match="says 5 items"):
        methods.Method("none-k5", "x", context=4)


# ---- the config ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("section, match", [
    ({"contexts": {"nonee": [5]}}, "unknown method 'nonee'"),
    ({"contexts": {"none": [5, 0]}}, r"methods\.contexts\.none: a context is a number of history items >= 1"),
    ({"contexts": {"none": []}}, "at least one context"),
    ({"contexts": {"none-k5": [5]}}, "key its method: none: \\[5\\]"),
    ({"run": ["none-k0"]}, r"methods\.run\.0: .*>= 1 history items, got 0"),
    ({"run": ["nonee-k5"]}, r"unknown method 'nonee-k5'.*context variant"),
])  # fmt: skip
def test_bad_contexts_are_config_errors(section, match):
    with pytest.raises(ConfigError, match=match):
        parse_config({**MINIMAL, "methods": section})


def test_the_study_runs_each_variant_once_in_table_order():
    cfg = parse_config({**MINIMAL, "methods": {"run": ["none", "soft_token", "none-k2"], "recent_k": 10, "long_m": 20,
                                               "contexts": {"none": [20, 5, 10, 5], "text_history": [20, 3]}}})
    # none at recent_k (10) is none; text_history at long_m (20) is text_history; each family by context
    assert methods.study_methods(cfg.methods) == ("none-k2", "none-k5", "none", "none-k20", "soft_token",
                                                  "text_history-k3", "text_history")
    assert methods.canonical("none-k10", 10, 20) == "none" and methods.canonical("none_long-k20", 10, 20) == "none_long"
    load = parse_config({"name": "l", "load": {"study": "s.yaml", "checkpoints": ["trained:none-k5"]}})
    assert load.load.checkpoints == ("trained:none-k5",)


def test_same_context_references_pair_each_row_with_none_at_its_items():
    rows = ["popularity", "sasrec", "none", "none-k5", "none-k20", "text_history", "text_history-k5", "soft_token",
            "soft_token-k5", "soft_token-k5/shuffled", "user_sid-k7"]
    assert methods.same_context_references(rows, recent_k=10, long_m=20) == {
        "text_history": "none-k20", "text_history-k5": "none-k5", "soft_token": "none", "soft_token-k5": "none-k5"}


# ---- the train cache key --------------------------------------------------------------------------------------


def test_a_variant_key_is_its_method_key_with_its_context(monkeypatch):
    from types import SimpleNamespace

    from workbench.study import inputs

    cfg = parse_config({**MINIMAL, "methods": {"recent_k": 3, "long_m": 5}})
    inp = SimpleNamespace(upstream_key="upstream", signal_key="signal")
    parts = {}

    def spy(*p):
        parts[len(parts)] = p
        return f"key{len(parts) - 1}"

    monkeypatch.setattr(inputs, "section_hash", spy)
    for m in ("none", "none-k2", "none-k3", "text_history-k2"):
        inputs.train_key(cfg, inp, m, 0.001, 0)
    base, k2, k3, th2 = parts[0], parts[1], parts[2], parts[3]
    assert k2 == (*base, {"context": 2})  # the method's parts, its context added: nothing else differs
    assert k3 == base  # none at recent_k (3) is none: its key unchanged
    assert th2[:5] + th2[6:] == k2[:5] + k2[6:] and th2[5] == "text_history"  # only the method differs
    monkeypatch.undo()
    assert len({inputs.train_key(cfg, inp, m, 0.001, 0) for m in ("none", "none-k2", "none-k4")}) == 3


# ---- a tiny study with variants -------------------------------------------------------------------------------


def test_a_tiny_study_trains_evaluates_and_draws_the_variants(tmp_path, data_dir, mlflow_store, one_torch_thread):
    if importlib.util.find_spec("recbole") is None:
        pytest.skip("MovieLens-100K ships in the recbole wheel: pip install --no-deps recbole==1.2.1")
    from mlflow.tracking import MlflowClient

    from workbench.config import deep_merge, load_config
    from workbench.model.checkpoint import read_meta
    from workbench.paths import REPO_ROOT
    from workbench.study.pipeline import run_experiment
    from workbench.study.summary import context_figure
    from workbench.testing import TINY_STUDY_OVERRIDES

    base = yaml.safe_load((REPO_ROOT / "experiments" / "quickstart.yaml").read_text())
    study = deep_merge(base, {**TINY_STUDY_OVERRIDES, "name": "variants", "split": {"max_history": 50},
                              "tracking": {"experiment": "variants"},
                              "methods": {"run": ["none"], "recent_k": 3, "long_m": 5,
                                          "contexts": {"none": [2, 3], "soft_token": [2]}}})  # fmt: skip
    study["evaluation"]["signal_ablation"] = False
    path = tmp_path / "variants.yaml"
    path.write_text(yaml.safe_dump(study))
    ctx = run_experiment(load_config(path), path)

    trained = ctx.products["train"]
    assert sorted(trained) == [("none", 0), ("none-k2", 0), ("soft_token-k2", 0)]  # none at 3 items is none
    assert read_meta(trained[("soft_token-k2", 0)].checkpoint).method == "soft_token-k2"
    assert len({r.checkpoint for r in trained.values()}) == 3
    table = ctx.products["evaluate"].set_index("method")
    depth = len(ctx.item_codes[0])
    assert table.loc["none-k2", names.PROMPT_TOKENS_MEAN] == 1 + 2 * depth  # <|hist|> and 2 SIDs (every user has 2)
    assert table.loc["none", names.PROMPT_TOKENS_MEAN] == 1 + 3 * depth
    assert table.loc["none-k2", names.CONTEXT_ITEMS] == 2 and table.loc["none", names.CONTEXT_ITEMS] == 3
    row = table.loc["soft_token-k2"]
    assert row[names.SAME_CONTEXT] == "none-k2"
    n10 = names.ndcg_at(10)
    assert row[f"vs_{names.SAME_CONTEXT}/{n10}"] == pytest.approx(row[n10] - table.loc["none-k2", n10], abs=1e-9)
    assert row[f"vs_{names.SAME_CONTEXT}/{n10}_lo"] <= row[f"vs_{names.SAME_CONTEXT}/{n10}_hi"]
    assert not isinstance(table.loc["none-k2", names.SAME_CONTEXT], str)  # none's own rows have no reference
    for m in ("none-k2", "soft_token-k2", "sasrec"):  # every trained row says its best epoch
        assert table.loc[m, names.BEST_EPOCH] >= 1 and table.loc[m, names.EPOCHS_RUN] >= table.loc[m, names.BEST_EPOCH]
    by_history = ctx.products["evaluate/by_history"]
    assert set(by_history.loc[by_history["method"] == "soft_token-k2", names.SAME_CONTEXT]) == {"none-k2"}

    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("variants").experiment_id])
    named = {r.data.tags.get("mlflow.runName"): r for r in runs}
    assert named["none-k2/seed0"].data.tags[names.TAG_METHOD] == "none-k2"
    assert any(n.startswith("train/soft_token-k2/seed0/") for n in named)
    parent = ctx.parent.run_id
    logged = {a.path for a in client.list_artifacts(parent)}
    assert {"quality_vs_prompt_length.html", "quality_vs_ms_per_request.html"} <= logged

    fig = context_figure(ctx.products["evaluate"], names.PROMPT_TOKENS_MEAN)
    lines = {t.name: t for t in fig.data}
    assert set(lines) == {"none", "soft_token"}  # one line per method family
    assert list(lines["none"].x) == sorted(lines["none"].x) and len(lines["none"].x) == 2
    assert list(lines["none"].text) == ["2 items", "3 items"]
    assert math.isfinite(context_figure(ctx.products["evaluate"], "latency/request_mean_ms").data[0].y[0])


def test_the_ml1m_sweep_files_say_what_they_run():
    """The ML-1M context sweep holds four contexts for none and text_history and shares the base study's trained
    models (same train keys); the budgets files set SASRec's 200 items and patience, and 4 layers for the deep one."""
    from types import SimpleNamespace

    from workbench.config import load_study
    from workbench.paths import REPO_ROOT
    from workbench.study.inputs import train_key

    exp = REPO_ROOT / "experiments"
    base, sweep = load_study(exp / "personalization_ml1m.yaml"), load_study(exp / "personalization_ml1m_contexts.yaml")
    rows = methods.study_methods(sweep.methods)
    for fam in ("none", "text_history"):
        assert len([r for r in rows if methods.family(r) == fam]) >= 4, fam
    inp = SimpleNamespace(upstream_key="ml1m", signal_key="signal")
    for m in ("none", "text_history", "user_sid", "soft_token"):
        assert train_key(sweep, inp, m, 0.002, 0) == train_key(base, inp, m, 0.002, 0), m
    budgets = load_study(exp / "personalization_ml1m_budgets.yaml")
    deep = load_study(exp / "personalization_ml1m_budgets_deep.yaml")
    assert budgets.evaluation.sasrec_max_len == 200 and budgets.evaluation.sasrec_patience is not None
    assert budgets.training.epochs > base.training.epochs and budgets.training.patience == 3
    assert deep.model.num_layers == 4 and "text_history" in deep.methods.run
    assert deep.evaluation == budgets.evaluation and deep.training == budgets.training


def test_cli_methods_runs_exactly_the_names_given(tmp_path, monkeypatch):
    """`workbench run FILE --methods none-k5 soft_token` runs those two: a variant by its name, the file's
    methods.contexts set aside (a merge of the override could not empty it)."""
    from workbench import cli
    from workbench.study import outputs

    seen = {}
    monkeypatch.setattr(outputs, "run_experiment", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    f = tmp_path / "s.yaml"
    contexts = {"none": [2], "text_history": [3]}
    f.write_text(yaml.safe_dump({**MINIMAL, "methods": {"run": ["none"], "contexts": contexts}}))
    assert cli.main(["run", str(f), "--methods", "none-k5", "soft_token"]) == 0
    assert methods.study_methods(seen["cfg"].methods) == ("none-k5", "soft_token")
    seen.clear()
    assert cli.main(["run", str(f)]) == 0
    assert methods.study_methods(seen["cfg"].methods) == ("none-k2", "none", "text_history-k3")
