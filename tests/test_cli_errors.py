"""The user's mistakes at the command line: a line or two saying what is wrong and how to fix it, exit 2.

One row per mistake, each run through the real CLI in a subprocess (what a user sees, stderr and exit
status, with nothing of this process's state). Rows that need a checkpoint get a tiny random one and
fail before any model loads; MLflow writes only to a temporary sqlite store.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
STUDY = {"name": "t", "dataset": {"name": "ml-100k"}}
MAX_LINES = 3  # "a line or two": the message, and at most a how-to-fix line and one more

# (id, argv with {placeholders} filled from the `inputs` fixture, phrase the message must contain)
ROWS = [
    ("run-yaml-syntax", ["run", "{syntax}"], "not valid YAML: line 3, column 13"),
    ("run-directory", ["run", "{folder}"], "is a directory"),
    ("run-missing-file", ["run", "{missing}"], "does not exist"),
    ("run-binary-file", ["run", "{binary}"], "is not UTF-8 text"),
    ("run-unknown-stage", ["run", "{study}", "--stages", "bogus"], "valid stages: data, embeddings, semantic_ids"),
    ("serve-missing-checkpoint", ["serve", "--checkpoint", "{missing}"], "does not exist"),
    ("serve-not-a-checkpoint", ["serve", "--checkpoint", "{folder}"], "workbench.json is missing"),
    ("serve-pickle-checkpoint", ["serve", "--checkpoint", "{pickle_ck}"], "loads safetensors only"),
    ("serve-port-out-of-range", ["serve", "--checkpoint", "{ck}", "--port", "99999"], "use --port 1-65535"),
    ("serve-port-zero", ["serve", "--checkpoint", "{ck}", "--port", "0"], "port 0"),
    ("serve-port-in-use", ["serve", "--checkpoint", "{ck}", "--port", "{busy_port}"], "already in use"),
    ("serve-device-unknown", ["serve", "--checkpoint", "{ck}", "--device", "gpu"], "use cpu, cuda or cuda:N"),
    # no CUDA here: "sees no CUDA device"; on a GPU host cuda:99 is beyond its GPUs: "torch sees N CUDA device(s)"
    ("serve-device-cuda-absent", ["serve", "--checkpoint", "{ck}", "--device", "cuda:99"], "CUDA device"),
    ("bench-yaml-syntax", ["bench", "{syntax}"], "not valid YAML: line 3, column 13"),
    ("bench-directory", ["bench", "{folder}"], "is a directory"),
    ("bench-missing-file", ["bench", "{missing}"], "does not exist"),
    ("bench-binary-file", ["bench", "{binary}"], "is not UTF-8 text"),
    ("report-output-is-directory", ["report", "--experiment", "x", "-o", "{folder}"], "is a directory"),
    ("report-unknown-experiment", ["report", "--experiment", "nope", "-o", "{out}"], "no MLflow experiment 'nope'"),
    ("microbench-bad-ab-option", ["microbench", "--ab", "gemm=mkl", "gemm=onednn"], "'gemm=mkl' is not one of"),
    ("microbench-dtype-both", ["microbench", "--dtype", "both"], "--dtype both is for --floor"),
    ("microbench-1.7b-on-disk", ["microbench", "--model", "1.7b"], "built in memory on the device it runs on"),
    ("variant-quality-missing-study", ["variant-quality", "{missing}"], "does not exist"),
]


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def pickle_only_copy(checkpoint: Path, dest: Path) -> Path:
    """`checkpoint` with its weights as pytorch_model.bin (torch.save) and no model.safetensors."""
    import torch
    from safetensors.torch import load_file

    shutil.copytree(checkpoint, dest)
    torch.save(load_file(str(dest / "model.safetensors")), dest / "pytorch_model.bin")
    (dest / "model.safetensors").unlink()
    return dest


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("cli_env")
    return {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}",
            "WORKBENCH_MLRUNS_DIR": str(tmp / "mlruns"), "WORKBENCH_DATA_DIR": str(tmp / "data")}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, bench_checkpoint):
    """Every input a row names: broken files, folders, a valid and a pickle-only checkpoint, a busy port."""
    d = tmp_path_factory.mktemp("cli_inputs")
    (d / "syntax.yaml").write_text("name: t\ndataset: {name: ml-100k\n  min_rating: [\n")  # unclosed flow mapping
    (d / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    (d / "folder").mkdir()
    (d / "study.yaml").write_text(yaml.safe_dump(STUDY))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    yield {"syntax": d / "syntax.yaml", "binary": d / "binary.yaml", "folder": d / "folder", "missing": d / "nope.yaml",
           "study": d / "study.yaml", "out": d / "report.html", "ck": bench_checkpoint,
           "pickle_ck": pickle_only_copy(bench_checkpoint, d / "pickle_ck"), "busy_port": busy.getsockname()[1]}
    busy.close()


@pytest.mark.parametrize("args,phrase", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_mistake_is_a_short_message(args, phrase, inputs, env):
    r = _cli([a.format(**inputs) for a in args], env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and 1 <= len(lines) <= MAX_LINES, r.stderr
    assert phrase in r.stderr, r.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(where, inputs, env):
    args = ["run", str(inputs["syntax"])]
    r = _cli(["--debug", *args] if where == "before" else [*args, "--debug"], env)
    assert r.returncode == 2 and "Traceback (most recent call last)" in r.stderr, r.stderr
    assert "ConfigError" in r.stderr and "not valid YAML" in r.stderr


def test_validate_reports_every_file(inputs, env):
    good = ROOT / "experiments" / "quickstart.yaml"
    r = _cli(["validate", str(inputs["syntax"]), str(good), str(inputs["binary"])], env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"ok: {good}" in r.stdout
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 2 and "Traceback" not in r.stderr, r.stderr
    assert str(inputs["syntax"]) in errors[0] and "not valid YAML" in errors[0]
    assert str(inputs["binary"]) in errors[1] and "not UTF-8" in errors[1]
