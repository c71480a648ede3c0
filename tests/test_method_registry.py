"""Adding a personalization method touches one file: a sixth, toy method defined here alone runs a tiny study.

`last_item` shows the model only the SID of the user's last item (no marker, no user signal). It is declared
and registered in this file; nothing in the package names it. The prompt and window builders, the config, the
train and evaluate stages and the comparison table take it from the registry (`workbench/study/methods/`).
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
from workbench.study.prompts import PromptBuilder, PromptError, UserEncoder
from workbench.study.windows import WindowBuilder

pytestmark = pytest.mark.timeout(600)


class LastItem(methods.Method):
    """The prompt is the SID of the user's last item; a window is two items, the second the target."""

    def head(self, vocab, signal):
        return [], None


LAST_ITEM = LastItem("last_item", "S(h[-1])", context=1)


@pytest.fixture
def last_item():
    methods.register(LAST_ITEM)
    yield LAST_ITEM
    methods.unregister(LAST_ITEM.name)


# ---- the registry -------------------------------------------------------------------------------------


def test_builtins_are_registered_in_table_order():
    assert methods.names()[: len(names.METHODS)] == names.METHODS
    assert methods.reading_signal() == ("user_sid", "soft_token")
    assert methods.get("soft_token").signal == methods.VECTOR and methods.get("user_sid").signal == methods.USER_SIDS
    assert methods.get("text_history").needs_text and methods.get("none_long").context == "long_m"


def test_unknown_and_duplicate_names_are_clear(last_item):
    with pytest.raises(methods.UnknownMethod, match="unknown method 'bogus'; registered methods: none, .*last_item"):
        methods.get("bogus")
    with pytest.raises(ValueError, match="registered already"):
        methods.register(LastItem("last_item", "S(h[-1])", context=1))
    with pytest.raises(ValueError, match="signal"):
        methods.Method("odd", "x", signal="features")
    with pytest.raises(ValueError, match="identifier"):
        methods.Method("two words", "x")


# ---- the config accepts what the registry holds ------------------------------------------------------

MINIMAL = {"name": "t", "dataset": {"name": "ml-100k"}}


def test_config_takes_registered_methods_and_names_the_valid_ones(last_item):
    cfg = parse_config({**MINIMAL, "methods": {"run": ["none", "last_item"]}})
    assert cfg.methods.run == ("none", "last_item")
    assert parse_config(MINIMAL).methods.run == names.METHODS  # the default: the built-ins
    with pytest.raises(ConfigError) as e:
        parse_config({**MINIMAL, "methods": {"run": ["last_item", "last_itme"]}})
    msg = str(e.value)
    assert "methods.run.1" in msg and "'last_itme'" in msg and "'last_item'" in msg and "'soft_token'" in msg


def test_an_unregistered_method_is_a_config_error():
    with pytest.raises(ConfigError, match=r"methods\.run\.0: .*unknown method 'last_item'"):
        parse_config({**MINIMAL, "methods": {"run": ["last_item"]}})


# ---- its tokens, built by the generic builders ----------------------------------------------------------

N_ITEMS = 12
CODES = add_dedup_digit(np.stack([np.arange(N_ITEMS) % 4, np.arange(N_ITEMS) // 4], 1))
LAYOUT = SidLayout(base_vocab_size=100, item_codebooks=(4, 4), dedup_size=int(CODES[:, -1].max()) + 1)
SIDS = LAYOUT.item_codes_to_ids(CODES)


def test_prompt_and_windows_come_from_the_method(last_item):
    b = PromptBuilder("last_item", LAYOUT, SIDS, recent_k=3, long_m=5)
    assert b.build([3, 7, 1]) == (SIDS[1].tolist(), None) and b.template == "S(h[-1])"
    train = [np.array([4, 2, 9, 5, 0], dtype=np.int64), np.array([8, 3], dtype=np.int64)]
    enc = UserEncoder(lambda users, lists, as_of: None, 2)
    ws = WindowBuilder(b, max_tokens=64).epoch(train, enc, np.random.default_rng(0))
    assert sorted((w.user, int(t)) for w in ws.windows for t in w.targets) == [(0, 0), (0, 2), (0, 5), (0, 9), (1, 3)]
    for w in ws.windows:  # one target per window; its view is the evaluation prompt of the item before it
        assert len(w.items) == 2 and w.ids.tolist() == b.build(w.items[:1])[0] + SIDS[w.items[1]].tolist()
        assert w.loss_tok.tolist() == SIDS[w.items[1]].tolist() and w.user_vector is None
    ps = PromptBuilder("last_item", LAYOUT, SIDS, 3, 5)
    with pytest.raises(PromptError, match="applies to the methods that read a user signal"):
        from workbench.study.prompts import build_prompts

        build_prompts(ps, [0], [[1, 2]], [3]).with_signal("zeroed")


# ---- a tiny study with it ----------------------------------------------------------------------------------


def test_a_tiny_study_runs_the_toy_method_into_the_comparison_table(last_item, tmp_path, data_dir, mlflow_store,
                                                                    one_torch_thread):
    if importlib.util.find_spec("recbole") is None:
        pytest.skip("MovieLens-100K ships in the recbole wheel: pip install --no-deps recbole==1.2.1")
    from workbench.config import deep_merge, load_config
    from workbench.model.checkpoint import read_meta
    from workbench.paths import REPO_ROOT
    from workbench.study.pipeline import run_experiment
    from workbench.testing import TINY_STUDY_OVERRIDES

    base = yaml.safe_load((REPO_ROOT / "experiments" / "quickstart.yaml").read_text())
    study = deep_merge(base, {**TINY_STUDY_OVERRIDES, "name": "toy_method", "split": {"max_history": 50},
                              "methods": {"run": ["last_item"], "recent_k": 3, "long_m": 5}})
    path = tmp_path / "toy_method.yaml"
    path.write_text(yaml.safe_dump(study))
    ctx = run_experiment(load_config(path), path)

    table = ctx.products["evaluate"].set_index("method")
    assert "last_item" in table.index and {"popularity", "als", "sasrec"} <= set(table.index)
    row = table.loc["last_item"]
    for metric in (names.recall_at(10), names.ndcg_at(10), names.MRR, names.PROMPT_TOKENS_MEAN):
        assert math.isfinite(row[metric]), metric
    depth = len(ctx.item_codes[0])
    assert row[names.PROMPT_TOKENS_MEAN] == depth  # one item's SID, nothing else
    assert "last_item/shuffled" not in table.index  # no user signal, no ablation
    (res,) = [r for (m, _), r in ctx.products["train"].items() if m == "last_item"]
    assert read_meta(res.checkpoint).method == "last_item" and read_meta(res.checkpoint).prompt_template == "S(h[-1])"
