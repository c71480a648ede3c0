"""The one cache helper: complete entries are reused, anything else is recomputed from a clean folder."""

from __future__ import annotations

import json

import pytest

from workbench.cache import cached, read_done
from workbench.paths import cache_dir


@pytest.fixture
def calls(data_dir):
    return []


def _compute(calls, value="v"):
    def compute(folder):
        calls.append("compute")
        (folder / "x.txt").write_text(value)
        return value, {"n": len(calls)}
    return compute


def _load(folder, info):
    return (folder / "x.txt").read_text()


def test_second_call_is_a_hit(calls, capsys):
    assert cached("k", "a", _compute(calls), _load) == ("v", {"n": 1}, False)
    assert cached("k", "a", _compute(calls), _load) == ("v", {"n": 1}, True)
    assert calls == ["compute"]
    out = capsys.readouterr().out
    assert "cache stored k/a" in out and "cache hit k/a" in out


@pytest.mark.parametrize("damage", ["corrupt", "half_written", "not_a_dict", "files_deleted"])
def test_damaged_entry_is_recomputed_from_a_clean_folder(calls, damage):
    _, _, _ = cached("k", "b", _compute(calls), _load)
    folder = cache_dir("k", "b")
    (folder / "stale.bin").write_text("left over")
    if damage == "corrupt":
        (folder / "done.json").write_text('{"n": 1')  # cut mid-write
    elif damage == "half_written":
        (folder / "done.json").unlink()  # interrupted before done.json
    elif damage == "not_a_dict":
        (folder / "done.json").write_text(json.dumps([1, 2]))
    else:
        (folder / "x.txt").unlink()  # load() raises: treated as a miss
    value, info, hit = cached("k", "b", _compute(calls, "w"), _load)
    assert (value, hit) == ("w", False) and calls == ["compute", "compute"]
    if damage != "files_deleted":
        assert not (folder / "stale.bin").exists(), "a damaged entry must be emptied before recomputing"
    assert read_done(folder) == {"n": 2}


def test_a_failed_compute_leaves_no_complete_entry(calls):
    def boom(folder):
        (folder / "partial").write_text("x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        cached("k", "c", boom, _load)
    assert not cache_dir("k", "c").joinpath("partial").exists()  # its folder went with it
    assert cached("k", "c", _compute(calls), _load)[2] is False  # recomputed, not a hit on the partial folder


def test_a_resumable_entry_keeps_its_progress(calls):
    """`resumable=True`: an interrupted compute's files stay for the next attempt to pick up (training's resume.pt)."""

    def interrupted(folder):
        (folder / "progress").write_text("epoch 3")
        raise KeyboardInterrupt

    def resume(folder):
        calls.append((folder / "progress").read_text())
        (folder / "x.txt").write_text("v")
        return "v", {}

    with pytest.raises(KeyboardInterrupt):
        cached("k", "d", interrupted, _load, resumable=True)
    assert cached("k", "d", resume, _load, resumable=True)[0] == "v" and calls == ["epoch 3"]
