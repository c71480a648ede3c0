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
