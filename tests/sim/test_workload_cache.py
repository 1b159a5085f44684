"""`--workload-cache`: a built workload read back equals a fresh build; any input it is built from
changes its key; a file that cannot be read is rebuilt."""

from __future__ import annotations

import shutil
from pathlib import Path

from hintkv.sim.workload import build_workload
from hintkv.sim.workload_cache import cached_workload

KNOBS = dict(users=3, seed=1, token_scale=0.05, max_calls=4, max_tasks=5)


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("workload-*.pickle"))


def test_read_back_equals_a_fresh_build(traces, tmp_path):
    built, hit = cached_workload(tmp_path, [traces], **KNOBS)
    assert not hit and len(_files(tmp_path)) == 1
    again, hit = cached_workload(tmp_path, [traces], **KNOBS)
    assert hit
    fresh = build_workload([traces], **KNOBS)
    assert again == fresh == built  # every call's tokens, waits, spawns; users' starts; meta
    assert again.users[0].tasks[0].root.calls[0].prompt_ids() == fresh.users[0].tasks[0].root.calls[0].prompt_ids()


def test_each_knob_and_the_trace_bytes_make_a_new_key(traces, tmp_path):
    cached_workload(tmp_path, [traces], **KNOBS)
    for change in ({"seed": 2}, {"users": 4}, {"token_scale": 0.1}, {"max_calls": 3}, {"max_tasks": 4}):
        wl, hit = cached_workload(tmp_path, [traces], **{**KNOBS, **change})
        assert not hit, change
        assert wl == build_workload([traces], **{**KNOBS, **change})
    assert len(_files(tmp_path)) == 6
    # the same file names with one file's bytes changed: not the cached workload
    other = tmp_path / "traces"
    shutil.copytree(traces, other)
    _, hit = cached_workload(tmp_path / "c2", [str(other)], **KNOBS)
    assert not hit
    _, hit = cached_workload(tmp_path / "c2", [str(other)], **KNOBS)
    assert hit
    a, b = sorted(other.iterdir())[:2]
    a.write_bytes(b.read_bytes())
    wl, hit = cached_workload(tmp_path / "c2", [str(other)], **KNOBS)
    assert not hit
    assert wl == build_workload([str(other)], **KNOBS)


def test_an_unreadable_file_is_rebuilt(traces, tmp_path):
    cached_workload(tmp_path, [traces], **KNOBS)
    (path,) = _files(tmp_path)
    path.write_bytes(path.read_bytes()[:100])  # cut short
    wl, hit = cached_workload(tmp_path, [traces], **KNOBS)
    assert not hit
    assert wl == build_workload([traces], **KNOBS)
    _, hit = cached_workload(tmp_path, [traces], **KNOBS)
    assert hit  # written again whole
