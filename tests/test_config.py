"""Config validation: bad keys, types and names fail before any work, naming the key path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workbench.config import ConfigError, load_config, parse_config, section_hash

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = {"name": "t", "dataset": {"name": "ml-100k"}}


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
        parse_config({**MINIMAL, "engines": [{"name": "tgi"}]})
    assert "engines.0.name" in str(e.value) and "trtllm" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config({**MINIMAL, "cost": {"reference_method": "None"}})
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
