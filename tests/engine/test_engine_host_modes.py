"""The live host tier's `deferred` offload and `exclusive` placement (`--offload-mode deferred
--host-mode exclusive`) on the tiny dummy model: an offload hint writes nothing, the device's
eviction writes the session's blocks down, a resume reads them back and the host forgets them,
and the output is the same as from a device-only engine."""

from __future__ import annotations

import pytest
from tier_engine_helpers import generate, prompt, session, settle, tiny_engine

from hintkv.cache.types import CacheEdit
from hintkv.config import EngineConfig

A = prompt(1)
FILL = [prompt(i, 7 * 16) for i in (2, 3)]  # each needs the whole 8-block pool: A goes


def _host(engine, hashes) -> int:
    return sum(1 for w in engine.tiers.stack.lookup(hashes) if w is not None)


def _offloaded_then_evicted(**modes):
    """An engine (deferred offload, `modes`) where session a was offloaded, then pushed below by
    two prompts that each need the whole pool; returns it and a's held blocks."""
    engine = tiny_engine(host_cache_memory="4MiB", offload_mode="deferred", **modes)
    engine.sam.predict_resume = False  # loads happen at admission or by hint, not ahead
    generate(engine, A, "a")
    held = list(engine.sessions.get("t", "a").held)
    engine.manage(session("a"), [CacheEdit("offload")])
    for i, p in enumerate(FILL):
        generate(engine, p, f"fill{i}")
    settle(engine)
    return engine, held


def test_deferred_exclusive_host_holds_only_what_the_device_evicted():
    ref_tokens, _ = generate(tiny_engine(kv_tokens=32 * 16), A, "a")
    engine = tiny_engine(host_cache_memory="4MiB", offload_mode="deferred", host_mode="exclusive")
    engine.sam.predict_resume = False  # the load must happen at admission, not ahead
    generate(engine, A, "a")
    held = list(engine.sessions.get("t", "a").held)
    assert len(held) == 4
    off, = engine.manage(session("a"), [CacheEdit("offload")])
    assert off.action == "offloaded" and off.tiers["host"] == (0, 0)  # nothing written at the hint
    settle(engine)
    assert engine.tiers.where(held) == {"device": 4, "host": 0}
    assert engine.tier_stats()["num_written_down"] == 0
    for i, p in enumerate(FILL):  # pressure: A's blocks are evicted, and written down then
        generate(engine, p, f"fill{i}")
    settle(engine)
    where = engine.tiers.where(held)
    assert where["device"] == 0 and where["host"] == 4, where
    written = engine.tier_stats()["num_written_down"]
    assert written >= 4
    out, cached = generate(engine, A, "a")  # the resume reads A's prefix back from the host
    assert out == ref_tokens and cached == 48
    assert engine.tier_stats()["hit_tokens"].get("host", 0) == 48
    settle(engine)
    loaded = held[:3]  # the prompt's last block is computed again (a prompt's last token always is)
    assert all(engine.kv.pool.lookup(h) is not None for h in loaded)
    assert _host(engine, loaded) == 0  # exclusive: read back, gone below
    engine.check_integrity()
    engine.close()


def test_inclusive_host_keeps_the_copy_it_loaded():
    engine, held = _offloaded_then_evicted()  # host_mode inclusive
    _, cached = generate(engine, A, "a")
    assert cached == 48
    settle(engine)
    loaded = held[:3]
    assert all(engine.kv.pool.lookup(h) is not None for h in loaded)
    assert _host(engine, loaded) == 3  # inclusive: the host keeps what it loaded
    engine.check_integrity()
    engine.close()


def test_exclusive_prefetch_moves_the_blocks_up():
    engine, held = _offloaded_then_evicted(host_mode="exclusive")
    assert engine.tiers.where(held) == {"device": 0, "host": 4}
    engine.sessions.end(engine.sessions.get("t", "fill1").key)  # room below the protected class
    pre, = engine.manage(session("a"), [CacheEdit("prefetch")])
    assert pre.action == "prefetched" and pre.tiers["device"][0] > 0
    settle(engine)
    up = [h for h in held if engine.kv.pool.lookup(h) is not None]
    assert len(up) == pre.tiers["device"][0] and _host(engine, up) == 0  # moved, not copied
    assert _host(engine, held) == 4 - len(up)
    engine.check_integrity()
    engine.close()


@pytest.mark.parametrize("field, value", [("offload_mode", "later"), ("host_mode", "both")])
def test_unknown_modes_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        EngineConfig(model="dummy:tiny", **{field: value})
