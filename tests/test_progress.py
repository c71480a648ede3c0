"""Progress off a terminal: a few plain lines (no carriage-return frames), whatever the number of updates."""

from __future__ import annotations

from workbench import progress as P


def test_lines_off_a_terminal_are_few_and_plain(capsys):
    for _ in P.progress(range(10_000), desc="work", unit="row"):
        pass
    bar = P.progress(total=50_000, desc="bar")
    for _ in range(50_000):
        bar.update(1)
    bar.set_postfix(loss="0.123")
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.strip().splitlines()
    # start + end per bar (the run takes far less than LINE_EVERY_S, so no periodic line)
    assert lines == ["[work] started (10000 row)", lines[1], "[bar] started (50000 it)", lines[3]]
    assert lines[1].startswith("[work] done 10000/10000 row") and lines[3].endswith("loss=0.123")


def test_periodic_lines_are_rate_limited(capsys, monkeypatch):
    monkeypatch.setattr(P, "LINE_EVERY_S", 0.0)
    for _ in P.progress(range(3), desc="w"):
        pass
    assert len(capsys.readouterr().err.strip().splitlines()) == 1 + 3 + 1


def test_disabled_prints_nothing(capsys):
    assert list(P.progress(range(3), enabled=False)) == [0, 1, 2]
    b = P.progress(total=3, enabled=False)
    b.update(3)
    b.close()
    assert capsys.readouterr().err == ""


def _microbench_stderr(tmp_path, **env_extra) -> str:
    """stderr (a pipe, as in `make demo > log`) of a real `workbench microbench` that writes a random checkpoint
    and loads it twice through transformers (the two bars that filled logs: "Writing model shards", "Loading
    weights")."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != P.HF_BARS_ENV}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", WORKBENCH_MLRUNS_DIR=str(tmp_path),
               OMP_NUM_THREADS="1", **env_extra)
    r = subprocess.run([sys.executable, "-m", "workbench.cli", "microbench", "--ab", "gemm=default", "gemm=default",
                        "--quick", "--model", "0.1m", "--threads", "1", "--prompt-len", "16", "--beam", "2",
                        "--new-tokens", "3", "--no-track"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=env, cwd=Path(__file__).resolve().parent.parent, timeout=300)
    err = r.stderr.decode()  # bytes: text mode would turn tqdm's carriage returns into newlines
    assert r.returncode == 0, err
    assert "building a random 0.1m Qwen3 checkpoint" in err  # it did write and load a checkpoint
    return err


def test_library_bars_are_quiet_off_a_terminal(tmp_path):
    err = _microbench_stderr(tmp_path)
    assert "\r" not in err and "Loading weights" not in err and "Writing model shards" not in err, err
    # the control: the user's own setting wins, and with the bars on the same command does draw them
    err = _microbench_stderr(tmp_path, **{P.HF_BARS_ENV: "0"})
    assert "\r" in err and "Loading weights" in err and "Writing model shards" in err, err


def test_quiet_library_bars_leaves_a_terminal_alone(monkeypatch):
    monkeypatch.delenv(P.HF_BARS_ENV, raising=False)
    monkeypatch.setattr(P, "stderr_is_terminal", lambda: True)
    P.quiet_library_bars()
    import os

    assert P.HF_BARS_ENV not in os.environ
