"""The tiered engine on the tiny dummy model (real model runner, real tiers, real files).

The dummy model's greedy tokens are not very telling on their own, so besides the tokens each
check compares the KV the engine computed AFTER the reused prefix (the prompt's last block, which
attends over the prefix): it is bit-identical whether the prefix came from the device, host or
disk, and matches a full recompute to float tolerance.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from tier_engine_helpers import generate, prompt, session, settle, tiny_engine

from hintkv.cache.policies.base import UNHELD
from hintkv.cache.types import CacheEdit
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.disk_format import HEADER_SIZE

A = prompt(1)
FILL = [prompt(i, 7 * 16) for i in (2, 3)]  # each needs the whole 8-block pool: A goes


def last_block_kv(engine, sid: str = "a") -> torch.Tensor:
    """KV payload of the last block session `sid` holds of A's prompt (computed, never reused)."""
    h = engine.sessions.get("t", sid).held[3]
    b = engine.kv.pool.lookup(h)
    assert b is not None
    io = DeviceBlockIO(engine.runner.kv_caches)
    out = torch.empty((1, *io.layout.shape), dtype=io.layout.dtype)
    io.read([b.block_id], out)
    return out


def drop_last_block(engine, sid: str = "a") -> None:
    """Forget A's last prompt block (a range evict from token 48): it is computed again."""
    h = engine.sessions.get("t", sid).held[3]
    (out,) = engine.manage(session(sid), [CacheEdit("evict", token_start=48)])
    assert out.tiers["device"][0] == -1  # 67 tokens have KV: 4 full blocks, the last one goes
    # the evict released it (first to be reclaimed, still matchable): reclaim it now, or the
    # recomputed copy would register onto it and the full computation's KV would be read back
    b = engine.kv.pool.lookup(h)
    assert b is not None and b.ref_cnt == 0 and engine.kv.pool.drop(b)


def push_out(engine) -> None:
    for i, p in enumerate(FILL):
        generate(engine, p, f"fill{i}")


@pytest.fixture(scope="module")
def reference():
    """A computed in full, then A again with its prefix from the device pool (its last block
    dropped first, so that block is really recomputed as a chunk over the reused prefix: an
    identical block left in the pool would be found instead of the recomputed copy)."""
    engine = tiny_engine(kv_tokens=32 * 16)
    full, _ = generate(engine, A, "a")
    full_kv = last_block_kv(engine)
    drop_last_block(engine)
    again, cached = generate(engine, A, "a")
    assert cached == 48 and again == full
    return full, full_kv, last_block_kv(engine)


def _tier_config(where: str, tmp_path) -> dict:
    if where == "host":
        return {"host_cache_memory": "4MiB"}
    if where == "disk":
        return {"disk_cache_dir": str(tmp_path / "kv"), "disk_cache_size": "4MiB"}
    return {}


@pytest.mark.parametrize("where", ["device", "host", "disk", "recompute"])
def test_greedy_output_and_kv_identical_wherever_the_prefix_came_from(where, tmp_path, reference):
    tokens_ref, full_kv, device_kv = reference
    engine = tiny_engine(kv_tokens=(32 if where == "device" else 8) * 16,
                         **_tier_config(where, tmp_path))
    if engine.tiers is not None:
        engine.sam.predict_resume = False  # the load must happen at admission, not ahead
    generate(engine, A, "a")
    drop_last_block(engine)
    if where != "device":
        push_out(engine)
    out, cached = generate(engine, A, "a")
    assert out == tokens_ref
    hits = engine.tier_stats()["hit_tokens"]
    if where == "recompute":
        assert cached == 0
        torch.testing.assert_close(last_block_kv(engine), full_kv, rtol=1e-4, atol=1e-5)
    else:
        assert cached == 48
        assert hits.get(where, 0) > 0, hits
        assert torch.equal(last_block_kv(engine), device_kv)
    engine.check_integrity()
    engine.close()


@pytest.mark.parametrize("where", ["host", "disk"])
def test_offload_then_prefetch_round_trips_exact_bytes(where, tmp_path):
    engine = tiny_engine(**_tier_config(where, tmp_path), offload_mode="eager")
    engine.sam.predict_resume = False
    generate(engine, A, "a")
    held = engine.sessions.get("t", "a").held
    io = engine.tiers.io
    before = torch.empty((len(held), *io.layout.shape), dtype=io.layout.dtype)
    io.read([engine.kv.pool.lookup(h).block_id for h in held], before)

    off, = engine.manage(session("a"), [CacheEdit("offload")])
    assert off.action == "offloaded" and off.tiers[where] == (4, 64)
    settle(engine)
    assert engine.tiers.where(held) == {"device": 0, where: 4}
    engine.check_integrity()

    pre, = engine.manage(session("a"), [CacheEdit("prefetch")])
    assert pre.action == "prefetched" and pre.tiers["device"] == (4, 64)
    settle(engine)
    assert engine.tiers.where(held)["device"] == 4
    after = torch.empty_like(before)
    io.read([engine.kv.pool.lookup(h).block_id for h in held], after)
    assert torch.equal(before, after)
    assert engine.tier_stats()["num_prefetched"] == 4
    engine.check_integrity()
    engine.close()


@pytest.mark.parametrize("where", ["host", "disk"])
def test_lazy_offload_keeps_the_device_copy_and_evicts_it_without_a_write(where, tmp_path):
    engine = tiny_engine(**_tier_config(where, tmp_path), offload_mode="lazy")  # (the default is deferred)
    engine.sam.predict_resume = False
    generate(engine, A, "a")
    held = engine.sessions.get("t", "a").held
    off, = engine.manage(session("a"), [CacheEdit("offload")])
    assert off.action == "offloaded" and off.tiers[where] == (4, 64)
    settle(engine)
    engine.tiers.stack.flush()
    assert engine.tiers.where(held) == {"device": 4, where: 0}  # still on the device ...
    assert all(w is not None for w in engine.tiers.stack.lookup(held))  # ... and written below
    assert engine.tier_stats()["num_offload_dropped"] == 0
    written = engine.tier_stats()["num_written_down"]
    push_out(engine)  # pressure: the offloaded copies are reused with no second write
    settle(engine)
    assert engine.tiers.where(held)["device"] < 4
    stats = engine.tier_stats()
    assert stats["num_written_down"] - written <= sum(len(engine.sessions.get("t", f"fill{i}").held)
                                                       for i in range(len(FILL)))
    generate(engine, A, "a")  # the resume reads the written-down copies back
    assert engine.tier_stats()["num_loaded"] >= 1
    engine.check_integrity()
    engine.close()


def test_corrupted_disk_block_is_detected_and_recomputed(tmp_path, reference):
    tokens_ref, full_kv, _ = reference
    engine = tiny_engine(disk_cache_dir=str(tmp_path / "kv"), disk_cache_size="4MiB")
    engine.sam.predict_resume = False
    generate(engine, A, "a")
    push_out(engine)
    engine.tiers.stack.flush()
    first = engine.sessions.get("t", "a").held[0]
    path = tmp_path / "kv" / f"{first.hex()}.kv"
    assert path.exists()
    with open(path, "r+b") as f:  # flip one payload byte: the crc no longer matches
        f.seek(HEADER_SIZE + 100)
        byte = f.read(1)
        f.seek(HEADER_SIZE + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    out, cached = generate(engine, A, "a")
    stats = engine.tier_stats()
    assert out == tokens_ref
    assert stats["num_corrupt"] == 1 and stats["num_load_failed"] >= 1
    assert stats["hit_tokens"].get("disk", 0) == 0 and cached == 0  # the first block failed
    torch.testing.assert_close(last_block_kv(engine), full_kv, rtol=1e-4, atol=1e-5)
    engine.check_integrity()
    engine.close()


@pytest.mark.parametrize("trouble", ["unwritable", "full"])
def test_unusable_disk_degrades_to_recompute(trouble, tmp_path, reference):
    tokens_ref, _, _ = reference
    if trouble == "unwritable":
        (tmp_path / "file").write_text("not a directory")
        cfg = {"disk_cache_dir": str(tmp_path / "file" / "kv"), "disk_cache_size": "4MiB"}
    else:
        one_block = HEADER_SIZE + 8 * 2 * 16 * 2 * 64 * 4
        cfg = {"disk_cache_dir": str(tmp_path / "kv"), "disk_cache_size": one_block}
    engine = tiny_engine(**cfg)
    engine.sam.predict_resume = False
    generate(engine, A, "a")
    push_out(engine)
    out, cached = generate(engine, A, "a")
    assert out == tokens_ref
    stats = engine.tier_stats()
    if trouble == "unwritable":
        assert cached == 0 and stats["tiers"]["disk"]["num_blocks"] == 0
        assert stats["tiers"]["disk"]["put_failed"] > 0
    else:
        assert cached <= 16 and stats["tiers"]["disk"]["num_blocks"] <= 1
    engine.check_integrity()
    engine.close()


def test_hints_off_writes_every_evicted_block_down(tmp_path, reference):
    tokens_ref, _, _ = reference
    engine = tiny_engine(host_cache_memory="4MiB", hints=False, eviction_policy="lru")
    generate(engine, A)
    for p in FILL:
        generate(engine, p)
    out, cached = generate(engine, A)
    assert out == tokens_ref and cached == 48
    assert engine.tier_stats()["hit_tokens"].get("host", 0) > 0
    engine.close()


def test_random_workload_holds_capacities_and_leaks_nothing(tmp_path):
    """Sessions sharing a system prefix, random edits, a host tier of 3 blocks cascading into
    a disk tier of 6: every tier's integrity holds after each move; after every session is
    evicted no block is left on a lower tier, nor a file on disk, and the device's are released."""
    block = 8 * 2 * 16 * 2 * 64 * 4
    disk = tmp_path / "kv"
    engine = tiny_engine(host_cache_memory=3 * block, disk_cache_dir=str(disk),
                         disk_cache_size=6 * (HEADER_SIZE + block))
    rng = random.Random(7)
    system = prompt(99, 16)
    contexts = {f"s{i}": system + prompt(10 + i, 16) for i in range(4)}
    for _ in range(14):
        sid = rng.choice(sorted(contexts))
        op = rng.random()
        if op < 0.6:
            ctx = contexts[sid] = contexts[sid] + prompt(rng.randrange(10**6), 8)
            if len(ctx) > 6 * 16:
                ctx = contexts[sid] = system + prompt(rng.randrange(10**6), 16)
            generate(engine, ctx, sid, max_tokens=2)
        else:
            action = rng.choice(["offload", "prefetch", "evict"])
            engine.manage(session(sid), [CacheEdit(action)])
            engine.step()
        engine.check_integrity()
        for name, u in engine.tiers.stack.usage().items():
            assert u.num_blocks <= u.capacity_blocks, name
    settle(engine)
    for sid in contexts:
        engine.manage(session(sid), [CacheEdit("evict")])
    settle(engine)
    engine.check_integrity()
    assert all(u.num_blocks == 0 for u in engine.tiers.stack.usage().values())
    engine.close()
    assert not [f for f in os.listdir(disk) if f.endswith((".kv", ".tmp"))]
    # nobody holds anything: what stays cached on the device is released, the first to be reclaimed
    pool = engine.kv.pool
    assert pool.num_in_use == 0 and pool.num_cached_below(UNHELD + 1) == pool.num_cached_free
