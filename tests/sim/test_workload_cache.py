"""`--workload-cache`: a built workload read back equals a fresh build; the knobs and trace bytes change its
key; a damaged or foreign file is built again with a warning, never served and never fatal; a failed write
leaves nothing behind; the directory keeps its newest files. (The key's code and tokenizer parts:
test_workload_cache_key.py.)"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import time
import warnings
from pathlib import Path

import pytest

from hintkv.sim import workload_cache
from hintkv.sim.workload import build_workload
from hintkv.sim.workload_cache import MAGIC, WorkloadCacheWarning, cached_workload

KNOBS = dict(users=3, seed=1, token_scale=0.05, max_calls=4, max_tasks=5)


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("workload-*.pickle"))


def _frame(key_hex: str, payload: bytes) -> bytes:
    """A file in the cache's format around `payload` (a correct header and digest)."""
    kb = bytes.fromhex(key_hex)
    return MAGIC + kb + hashlib.sha256(kb + payload).digest() + payload


def test_read_back_equals_a_fresh_build(traces, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", WorkloadCacheWarning)  # a first miss and a hit warn of nothing
        built, hit = cached_workload(tmp_path, [traces], **KNOBS)
        assert not hit and len(_files(tmp_path)) == 1
        again, hit = cached_workload(tmp_path, [traces], **KNOBS)
    assert hit
    fresh = build_workload([traces], **KNOBS)
    assert again == fresh == built  # every call's tokens, waits, spawns; users' starts; meta
    assert again.users[0].tasks[0].root.calls[0].prompt_ids() == fresh.users[0].tasks[0].root.calls[0].prompt_ids()
    assert _files(tmp_path)[0].read_bytes().startswith(MAGIC)
    # folders given as Path: the same key as the same folders given as str
    _, hit = cached_workload(tmp_path, [Path(traces)], **KNOBS)
    assert hit


def _objects(wl) -> tuple[int, int, int]:
    """(distinct token ids, int objects holding them, chunk objects) over every prompt."""
    chunks = {id(ch): ch for t in wl.tasks() for a in t.agents() for c in a.calls for ch in c.prompt}
    tokens = [t for ch in chunks.values() for t in ch]
    return len(set(tokens)), len({id(t) for t in tokens}), len(chunks)


def test_read_back_shares_its_token_ints_and_chunks(traces, tmp_path):
    """A read-back workload holds one int object per token id, as a built one does (8 bytes a token,
    not 36: a plain pickle gives every token its own int), and one object per chunk."""
    built, _ = cached_workload(tmp_path, [traces], **{**KNOBS, "token_scale": 0.3})
    again, hit = cached_workload(tmp_path, [traces], **{**KNOBS, "token_scale": 0.3})
    assert hit and again == built
    ids, ints, chunks = _objects(again)
    assert ids > 1000 and ints == ids
    assert (ids, ints, chunks) == _objects(built)


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


def _damage(kind: str, path: Path, key: str, traces: str, tmp: Path) -> None:
    data = path.read_bytes()
    if kind == "cut short":
        path.write_bytes(data[:100])
    elif kind == "a byte flipped":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1:])
    elif kind == "another workload, old digest":  # loads cleanly as a Workload: only the digest tells
        other = pickle.dumps(build_workload([traces], **{**KNOBS, "seed": 2}), protocol=pickle.HIGHEST_PROTOCOL)
        path.write_bytes(data[:len(MAGIC) + 64] + other)
    elif kind == "the old format (a bare pickle)":
        path.write_bytes(data[len(MAGIC) + 64:])
    elif kind == "another format's header":  # the same key, digest and payload after it
        path.write_bytes(MAGIC[:-2] + b"1\n" + data[len(MAGIC):])
    elif kind == "bad pickle protocol":
        path.write_bytes(b"\x80\xd1")
    elif kind == "a foreign file":  # a whole, sound file of another key under this name
        _, _ = cached_workload(tmp / "other", [traces], **{**KNOBS, "seed": 2})
        path.write_bytes(_files(tmp / "other")[0].read_bytes())
    elif kind == "framed, not a Workload":
        path.write_bytes(_frame(key, pickle.dumps({"users": ()})))
    elif kind == "framed, stored as a workload but not one":
        path.write_bytes(_frame(key, workload_cache.dump_workload({"users": ((1000, 1001),)})))
    elif kind == "framed, bad pickle protocol":
        path.write_bytes(_frame(key, b"\x80\xd1"))
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["cut short", "a byte flipped", "another workload, old digest",
                                  "the old format (a bare pickle)", "another format's header",
                                  "bad pickle protocol", "a foreign file",
                                  "framed, not a Workload", "framed, stored as a workload but not one",
                                  "framed, bad pickle protocol"])
def test_a_damaged_or_foreign_file_is_built_again_with_a_warning(kind, traces, tmp_path):
    cached_workload(tmp_path, [traces], **KNOBS)
    (path,) = _files(tmp_path)
    key = path.stem.removeprefix("workload-")
    _damage(kind, path, key, traces, tmp_path)
    with pytest.warns(WorkloadCacheWarning):
        wl, hit = cached_workload(tmp_path, [traces], **KNOBS)
    assert not hit
    assert wl == build_workload([traces], **KNOBS)
    _, hit = cached_workload(tmp_path, [traces], **KNOBS)
    assert hit  # written again whole


def test_a_failed_write_warns_and_leaves_no_temporary_file(traces, tmp_path, monkeypatch):
    # the rename fails after the temporary file is whole: the file's name is taken by a directory
    taken = tmp_path / "c"
    cached_workload(taken, [traces], **KNOBS)
    (path,) = _files(taken)
    path.unlink()
    path.mkdir()
    (path / "x").write_bytes(b"")
    with pytest.warns(WorkloadCacheWarning) as warned:  # unreadable, then not written
        wl, hit = cached_workload(taken, [traces], **KNOBS)
    assert any("not written" in str(w.message) for w in warned)
    assert not hit and wl == build_workload([traces], **KNOBS)
    assert sorted(p.name for p in taken.iterdir()) == [path.name]
    # an error that is not an OSError while pickling: a warning too, never an exception
    def deep(*a, **k):
        raise RecursionError("maximum recursion depth exceeded while pickling an object")
    monkeypatch.setattr(workload_cache.pickle, "dumps", deep)
    with pytest.warns(WorkloadCacheWarning, match="RecursionError"):
        wl, hit = cached_workload(tmp_path / "d", [traces], **KNOBS)
    assert not hit and wl == build_workload([traces], **KNOBS)
    assert list((tmp_path / "d").glob("*")) == []


def test_the_directory_keeps_its_newest_files(traces, tmp_path, monkeypatch):
    monkeypatch.setattr(workload_cache, "KEEP", 2)
    dead, live = tmp_path / "workload-a.pickle.1.tmp", tmp_path / "workload-b.pickle.2.tmp"
    dead.write_bytes(b"x")
    live.write_bytes(b"x")
    old = time.time() - workload_cache.STALE_TMP_S - 60
    os.utime(dead, (old, old))  # a writer killed mid-write an hour ago; `live` is being written now
    for seed in (1, 2, 3):
        cached_workload(tmp_path, [traces], **{**KNOBS, "seed": seed})
    assert len(_files(tmp_path)) == 2
    assert not dead.exists() and live.exists()
    _, hit = cached_workload(tmp_path, [traces], **{**KNOBS, "seed": 1})
    assert not hit  # the oldest went
    for seed in (3, 1):
        _, hit = cached_workload(tmp_path, [traces], **{**KNOBS, "seed": seed})
        assert hit
