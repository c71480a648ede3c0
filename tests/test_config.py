"""Config validation: bad keys, types and names fail before any work, naming the key path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workbench.config import (ConfigError, StudyConfig, SweepConfig, load_config, load_study, load_sweep, parse_config,
                              section_hash)

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = {"name": "t", "dataset": {"name": "ml-100k"}}
SWEEP = {"name": "s", "load": {"workload": "beam_search"}}


def test_shipped_experiments_validate():
    files = sorted((ROOT / "experiments").glob("*.yaml"))
    assert any(f.name == "quickstart.yaml" for f in files)
    assert any(f.name == "personalization_ml1m.yaml" for f in files)
    for f in files:
        load_config(f)


def test_unknown_key_names_path():
    with pytest.raises(ConfigError) as e:
        parse_config({**MINIMAL, "semantic_ids": {"levles": 3}})
    assert "semantic_ids.levles" in str(e.value) and "unknown key" in str(e.value)


def test_unknown_dataset_lists_choices():
    with pytest.raises(ConfigError) as e:
        parse_config({"name": "t", "dataset": {"name": "ml-20m"}})
    msg = str(e.value)
    assert "dataset.name" in msg and "ml-100k" in msg and "ml-1m" in msg


def test_unknown_method_and_engine():
    with pytest.raises(ConfigError) as e:
        parse_config({**MINIMAL, "methods": {"run": ["none", "soft_tokens"]}})
    assert "methods.run.1" in str(e.value) and "soft_token" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config({**SWEEP, "engines": [{"name": "tgi"}]})
    assert "engines.0.name" in str(e.value) and "trtllm" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config({**SWEEP, "cost": {"reference_method": "None"}})
    assert "cost.reference_method" in str(e.value) and "soft_token" in str(e.value)


def test_wrong_type_and_range():
    with pytest.raises(ConfigError) as e:
        parse_config({**MINIMAL, "semantic_ids": {"levels": "three"}})
    assert "semantic_ids.levels" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config({**MINIMAL, "evaluation": {"beam_width": 5, "ks": [5, 10]}})
    assert "beam_width" in str(e.value) and "largest K" in str(e.value)


def test_bad_backbone():
    with pytest.raises(ConfigError) as e:
        parse_config({**MINIMAL, "model": {"backbone": "gpt2"}})
    assert "model.backbone" in str(e.value) and "hf:<path>" in str(e.value)


def test_section_hash_tracks_changes():
    a = parse_config(MINIMAL)
    b = parse_config({**MINIMAL, "semantic_ids": {"codebook_size": 128}})
    assert section_hash(a.semantic_ids) != section_hash(b.semantic_ids)
    assert section_hash(a.dataset) == section_hash(b.dataset)


def test_validate_cli(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**MINIMAL, "trainig": {}}))
    r = subprocess.run([sys.executable, "-m", "workbench.cli", "validate", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "trainig" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "validate", str(ROOT / "experiments/quickstart.yaml")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_import_is_light():
    code = (
        "import sys, workbench, workbench.config, workbench.cli, workbench.engines.base, workbench.sids.layout,"
        " workbench.engines.registry\n"
        "heavy = [m for m in ('torch', 'vllm', 'sglang', 'tensorrt_llm', 'transformers', 'mlflow') if m in sys.modules]\n"
        "print(heavy)\nassert not heavy, heavy"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_two_kinds_each_its_own_model():
    """A study file and a load-sweep file validate against their own models; keys of the other kind fail."""
    assert isinstance(parse_config(MINIMAL), StudyConfig) and isinstance(parse_config(SWEEP), SweepConfig)
    with pytest.raises(ConfigError) as e:
        parse_config({**SWEEP, "dataset": {"name": "ml-100k"}})  # a sweep records no dataset of its own
    assert "dataset" in str(e.value) and "unknown key" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config({**MINIMAL, "engines": [{"name": "torch"}]})  # engines belong to a sweep
    assert "engines" in str(e.value) and "unknown key" in str(e.value)
    assert parse_config(MINIMAL).experiment_name == "t" == parse_config({**SWEEP, "name": "t"}).experiment_name
    assert parse_config({**MINIMAL, "tracking": {"experiment": "x"}}).experiment_name == "x"


def test_wrong_kind_for_the_command_is_a_clear_error(tmp_path):
    study, sweep = tmp_path / "study.yaml", tmp_path / "sweep.yaml"
    study.write_text(yaml.safe_dump(MINIMAL))
    sweep.write_text(yaml.safe_dump(SWEEP))
    assert isinstance(load_study(study), StudyConfig) and isinstance(load_sweep(sweep), SweepConfig)
    with pytest.raises(ConfigError, match=r"is a sweep file .*workbench bench"):
        load_study(sweep)
    with pytest.raises(ConfigError, match=r"is a study file .*workbench run"):
        load_sweep(study)
    for cmd, f, other in (("run", sweep, "workbench bench"), ("bench", study, "workbench run")):
        r = subprocess.run([sys.executable, "-m", "workbench.cli", cmd, str(f)], capture_output=True, text=True)
        assert r.returncode == 2 and other in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_base_extends_another_file(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({**MINIMAL, "training": {"epochs": 4, "seeds": [0]}}))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text(yaml.safe_dump({"base": "../a.yaml", "name": "b", "training": {"seeds": [0, 1]}}))
    b = load_config(tmp_path / "sub" / "b.yaml")
    assert b.name == "b" and b.training.seeds == (0, 1) and b.training.epochs == 4  # deep merge, the file's keys win
    (tmp_path / "loop.yaml").write_text(yaml.safe_dump({"base": "loop.yaml", "name": "l"}))
    with pytest.raises(ConfigError, match="loops"):
        load_config(tmp_path / "loop.yaml")
    (tmp_path / "missing.yaml").write_text(yaml.safe_dump({"base": "nope.yaml", "name": "m"}))
    with pytest.raises(ConfigError, match=r"nope.yaml does not exist \(the `base:` of"):
        load_config(tmp_path / "missing.yaml")


def test_quickstart_variants_share_the_quickstart_caches():
    """seeds/exhaustive are a few lines on top of quickstart.yaml: every section a cache key reads is identical."""
    q = load_study(ROOT / "experiments/quickstart.yaml")
    for name in ("quickstart_seeds", "quickstart_exhaustive"):
        v = load_study(ROOT / f"experiments/{name}.yaml")
        for sec in ("dataset", "split", "embeddings", "semantic_ids", "user_sids", "model", "methods"):
            assert section_hash(getattr(v, sec)) == section_hash(getattr(q, sec)), (name, sec)
        assert v.seed == q.seed
        lines = [x for x in (ROOT / f"experiments/{name}.yaml").read_text().splitlines() if x.strip()]
        assert len(lines) < 15 and "base: quickstart.yaml" in lines


def test_bad_yaml_files_are_clear_errors(tmp_path):
    (tmp_path / "syntax.yaml").write_text("name: [unclosed\n")
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    for f, why in (("syntax.yaml", "not valid YAML"), ("latin1.yaml", "not UTF-8"), (".", "is a directory")):
        with pytest.raises(ConfigError, match=why):
            load_config(tmp_path / f)


def test_tracking_uri_key():
    """`tracking.uri` takes a store URI; a blank one, or one with a password in it (the config is logged
    with every run), is refused with the way out."""
    base = {"name": "t", "dataset": {"name": "ml-100k"}}
    cfg = parse_config({**base, "tracking": {"uri": " http://mlflow.lab:5000 "}})
    assert cfg.tracking.uri == "http://mlflow.lab:5000" and cfg.experiment_name == "t"
    assert parse_config(base).tracking.uri is None
    sweep = parse_config({"name": "w", "load": {}, "tracking": {"uri": "sqlite:////tmp/x.db"}})
    assert sweep.tracking.uri == "sqlite:////tmp/x.db"
    with pytest.raises(ConfigError, match="tracking.uri: .*without spaces"):
        parse_config({**base, "tracking": {"uri": "  "}})
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_PASSWORD"):
        parse_config({**base, "tracking": {"uri": "https://me:secret@mlflow.lab"}})
