"""Two real engines (dummy:tiny) on one pool: a session started on A resumes on B with its
prefix loaded from the pool (greedy output identical to a fresh engine's, cached tokens > 0);
evict hands the session's blocks back to the pool; live sessions are kept alive in batches."""

from __future__ import annotations

import time

import pytest

from hintkv.cache.spm import KEEPALIVE_EVERY_S
from hintkv.cache.types import CacheEdit
from tests.engine.tier_engine_helpers import (
    BLOCK,
    generate,
    prompt,
    session,
    tiny_engine,
)


@pytest.fixture(params=["embedded-dir", "mooncake"])
def pool_options(request, tmp_path):
    """Write-through on (`--pool-write-through`): these tests follow a finished request's blocks."""
    if request.param == "mooncake":
        m = request.getfixturevalue("mooncake_master")
        return {"pool": "mooncake", "pool_master": m.rpc_address, "pool_metadata": m.metadata_url,
                "pool_write_through": True}
    return {"pool": "embedded", "pool_dir": str(tmp_path / "pool"), "pool_write_through": True}


def test_a_session_moves_to_another_instance_and_loads_its_prefix(pool_options):
    a = tiny_engine(pool_size="4MiB", **pool_options)
    b = tiny_engine(pool_size="4MiB", **pool_options)
    fresh = tiny_engine()
    try:
        first = prompt(1, 4 * BLOCK)
        out_a, _ = generate(a, first, sid="s1")
        a.tiers.stack.flush()
        assert a.tier_stats()["pool"]["published"] >= 4
        resumed = first + out_a + prompt(2, BLOCK)
        out_b, cached = generate(b, resumed, sid="s1")
        expected, _ = generate(fresh, resumed)
        assert out_b == expected
        assert cached >= 4 * BLOCK
        pool_b = b.tier_stats()["pool"]
        assert pool_b["remote_hits"] >= 4 and b.kv.hit_tokens_by_tier.get("pool", 0) >= 4 * BLOCK
        a.tiers.check_integrity()
        b.tiers.check_integrity()
    finally:
        for e in (a, b, fresh):
            e.close()


def test_by_default_a_finished_request_leaves_the_pool_alone(tmp_path):
    """No write-through unless asked (`--pool-write-through`): the pool gets only what no private
    tier keeps."""
    a = tiny_engine(pool_size="4MiB", pool="embedded", pool_dir=str(tmp_path / "pool"))
    try:
        first = prompt(1, 4 * BLOCK)
        out, _ = generate(a, first, sid="s1")
        a.tiers.stack.flush()
        assert a.tier_stats()["pool"]["published"] == 0
        assert a.tiers.pool_tier.usage().num_blocks == 0
        _, cached = generate(a, first + out + prompt(2, BLOCK), sid="s1")
        assert cached >= 4 * BLOCK  # served from the device as before
        a.tiers.check_integrity()
    finally:
        a.close()


def test_evict_removes_the_session_blocks_nobody_else_holds(pool_options):
    a = tiny_engine(pool_size="4MiB", **pool_options)
    try:
        shared = prompt(5, 2 * BLOCK)
        generate(a, shared + prompt(6, 2 * BLOCK), sid="s1")
        generate(a, shared + prompt(7, 2 * BLOCK), sid="s2")
        a.tiers.stack.flush()
        pool = a.tiers.pool_tier
        assert pool.usage().num_blocks >= 6
        before = pool.usage().num_blocks
        a.manage(session("s1"), [CacheEdit("evict")])
        pool.flush()
        after = pool.usage().num_blocks
        assert before - after == 2  # s1's own blocks (and its last output block); shared stays
        held = a.sessions.sessions["t\x1fs2"].held
        assert all(pool.contains(h) for h in held)
        a.tiers.check_integrity()
    finally:
        a.close()


def test_live_sessions_are_kept_alive_in_one_call_per_tick(pool_options):
    a = tiny_engine(pool_size="4MiB", **pool_options)
    try:
        for i in range(3):
            generate(a, prompt(10 + i, 3 * BLOCK), sid=f"s{i}")
        a.tiers.stack.flush()
        before = a.tier_stats()["pool"]
        time.sleep(KEEPALIVE_EVERY_S + 0.05)
        a.step()
        a.step()  # within the same second: no second call
        a.tiers.stack.flush()
        s = a.tier_stats()["pool"]
        assert s["keepalive_calls"] - before["keepalive_calls"] == 1
        assert s["keepalive_keys"] - before["keepalive_keys"] == len(a.sessions.holders) == 9
    finally:
        a.close()


def test_pool_figures_reach_metrics_and_bad_flags_are_refused(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from hintkv.config import EngineConfig
    from hintkv.server.metrics import TierStatsCollector

    a = tiny_engine(pool="embedded", pool_size="4MiB", pool_write_through=True)
    try:
        generate(a, prompt(30, 3 * BLOCK), sid="m")
        a.tiers.stack.flush()
        registry = CollectorRegistry()
        registry.register(TierStatsCollector(a.tier_stats))
        text = generate_latest(registry).decode()
        assert 'hintkv_pool_events_total{event="puts"} 3.0' in text
        assert "hintkv_pool_bytes_peak " in text and "hintkv_pool_available 1.0" in text
    finally:
        a.close()
    for bad, field in (({"pool": "redis", "pool_size": "1MiB"}, "--pool"),
                       ({"pool": "embedded"}, "--pool-size"),
                       ({"pool": "mooncake", "pool_size": "1MiB"}, "--pool-master"),
                       ({"pool_policy": "fifo"}, "--pool-policy")):
        with pytest.raises(ValueError, match=field):
            EngineConfig(model="dummy:tiny", **bad)


def test_by_default_the_host_tiers_evictions_reach_the_pool(tmp_path):
    """Write-through off (the default): what the host tier evicts goes to the pool, and a session
    whose blocks left both private tiers resumes from the pool with the right output."""
    # lru: which blocks leave the device and the host tier follows recency alone. sam would keep
    # s0 on the device once it waits past its expected gap, which depends on how fast this
    # machine runs the loop below (under load it did: 3 of 4 blocks stayed on the device).
    a = tiny_engine(pool_size="4MiB", pool="embedded", pool_dir=str(tmp_path / "pool"),
                    host_cache_memory="512KiB", eviction_policy="lru")  # 4 blocks of dummy:tiny
    fresh = tiny_engine()
    try:
        host_blocks = a.tiers.stack.tiers[0].capacity_blocks
        first = prompt(1, 4 * BLOCK)
        out, _ = generate(a, first, sid="s0")
        for i in range(1, 4 + host_blocks // 4 + 2):  # push s0 off the device and the host tier
            generate(a, prompt(10 + i, 4 * BLOCK), sid=f"s{i}")
        a.tiers.stack.flush()
        stats = a.tier_stats()["pool"]
        assert stats["published"] == 0 and stats["puts"] > 0
        resumed = first + out + prompt(2, BLOCK)
        out_a, cached = generate(a, resumed, sid="s0")
        assert out_a == generate(fresh, resumed)[0]
        assert cached >= 4 * BLOCK and a.kv.hit_tokens_by_tier.get("pool", 0) >= 4 * BLOCK
        a.tiers.check_integrity()
    finally:
        a.close()
        fresh.close()


def test_with_a_disk_tier_the_disk_tiers_evictions_reach_the_pool(tmp_path):
    """host -> disk -> pool: a session whose blocks left the device, the host and the disk
    resumes from the pool with the right output (the disk tier hands its evictions down)."""
    a = tiny_engine(pool_size="4MiB", pool="embedded", pool_dir=str(tmp_path / "pool"),
                    host_cache_memory="512KiB", disk_cache_dir=str(tmp_path / "disk"),
                    disk_cache_size="600KiB", eviction_policy="lru")  # lru: see the test above
    fresh = tiny_engine()
    try:
        host, disk, _ = a.tiers.stack.tiers
        assert disk.capacity_blocks == 4
        first = prompt(1, 4 * BLOCK)
        out, _ = generate(a, first, sid="s0")
        below = host.capacity_blocks + disk.capacity_blocks
        for i in range(1, 4 + below // 4 + 2):  # push s0 off the device, the host and the disk
            generate(a, prompt(10 + i, 4 * BLOCK), sid=f"s{i}")
        a.tiers.stack.flush()
        assert disk.stats().num_evicted >= 4 and a.tier_stats()["pool"]["puts"] >= 4
        resumed = first + out + prompt(2, BLOCK)
        out_a, cached = generate(a, resumed, sid="s0")
        assert out_a == generate(fresh, resumed)[0]
        assert cached >= 4 * BLOCK and a.kv.hit_tokens_by_tier.get("pool", 0) >= 4 * BLOCK
        a.tiers.check_integrity()
    finally:
        a.close()
        fresh.close()
