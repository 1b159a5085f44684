"""`--kv-cache-dtype int8 | fp8` through the real engine (dummy:tiny) and its real tiers: a
quantised block (values and their scales) round-trips through host, disk and the pool byte for
byte; a block written in one format is a miss in another, never wrong KV; the same memory holds
~3.8x the blocks of float32; bad values are refused with the field named."""

from __future__ import annotations

import pytest
import torch

from hintkv.cache.types import CacheEdit
from hintkv.config import EngineConfig
from tests.engine.tier_engine_helpers import (
    BLOCK,
    generate,
    prompt,
    session,
    settle,
    tiny_engine,
)

FORMATS = ["int8", "fp8"]


def _payloads(engine, hashes) -> torch.Tensor:
    io = engine.tiers.io
    out = torch.empty((len(hashes), *io.layout.shape), dtype=io.layout.dtype)
    io.read([engine.kv.pool.lookup(h).block_id for h in hashes], out)
    return out


@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("where", ["host", "disk"])
def test_quantised_blocks_round_trip_through_host_and_disk(kv, where, tmp_path):
    tier = ({"host_cache_memory": "4MiB"} if where == "host"
            else {"disk_cache_dir": str(tmp_path / "kv"), "disk_cache_size": "4MiB"})
    engine = tiny_engine(kv_cache_dtype=kv, offload_mode="eager", **tier)
    engine.sam.predict_resume = False
    head_dim = engine.model_config.head_dim
    layout = engine.tiers.io.layout
    assert layout.head_dim == head_dim + 4 and layout.dtype == (torch.int8 if kv == "int8" else torch.uint8)
    generate(engine, prompt(1), "a")
    held = engine.sessions.get("t", "a").held
    before = _payloads(engine, held)
    scales = before[..., head_dim:].contiguous().view(torch.float32)
    assert bool((scales > 0).all())  # every row carries its scale
    (off,) = engine.manage(session("a"), [CacheEdit("offload")])
    assert off.tiers[where] == (4, 64)
    settle(engine)
    assert engine.tiers.where(held) == {"device": 0, where: 4}
    (pre,) = engine.manage(session("a"), [CacheEdit("prefetch")])
    assert pre.action == "prefetched"
    settle(engine)
    assert engine.tiers.where(held)["device"] == 4
    assert torch.equal(before, _payloads(engine, held))
    engine.check_integrity()
    engine.close()


def _session_then_resume(engine, first):
    out, _ = generate(engine, first, sid="s1")
    return first + out + prompt(2, BLOCK)


@pytest.mark.parametrize("kv", FORMATS)
def test_a_quantised_session_resumes_on_another_instance_from_the_pool(kv, tmp_path):
    opts = {"pool": "embedded", "pool_dir": str(tmp_path / "pool"), "pool_size": "4MiB", "kv_cache_dtype": kv,
            "pool_write_through": True}
    a, b = tiny_engine(**opts), tiny_engine(**opts)
    same = tiny_engine(kv_tokens=32 * BLOCK, kv_cache_dtype=kv)  # the prefix from its own device pool
    try:
        first = prompt(1, 4 * BLOCK)
        resumed = _session_then_resume(a, first)
        a.tiers.stack.flush()
        out_b, cached = generate(b, resumed, sid="s1")
        _session_then_resume(same, first)
        expected, cached_same = generate(same, resumed, sid="s1")
        assert cached >= 4 * BLOCK and cached == cached_same
        assert b.kv.hit_tokens_by_tier.get("pool", 0) >= 4 * BLOCK
        assert out_b == expected
    finally:
        for e in (a, b, same):
            e.close()


@pytest.mark.parametrize("tier", ["disk", "pool"])
@pytest.mark.parametrize("written,read", [("int8", "fp8"), ("int8", "auto"), ("auto", "int8")])
def test_a_block_written_in_another_format_is_a_miss(written, read, tier, tmp_path):
    """Disk files (reused) and pool blocks of one format are never read as another."""
    opts = ({"disk_cache_dir": str(tmp_path / "kv"), "disk_cache_size": "4MiB"} if tier == "disk"
            else {"pool": "embedded", "pool_dir": str(tmp_path / "pool"), "pool_size": "4MiB"})
    first = prompt(1, 4 * BLOCK)
    writer = tiny_engine(kv_cache_dtype=written, offload_mode="eager", **opts)
    writer.sam.predict_resume = False
    try:
        generate(writer, first, sid="s1")
        writer.manage(session("s1"), [CacheEdit("offload")])
        settle(writer)
        writer.tiers.stack.flush()
        assert writer.tiers.where(writer.sessions.get("t", "s1").held).get(tier, 0) >= 4
    finally:
        writer.close()
    if tier == "disk":
        opts["disk_cache_reuse"] = True
    reader = tiny_engine(kv_cache_dtype=read, **opts)
    fresh = tiny_engine(kv_cache_dtype=read)
    try:
        out, cached = generate(reader, first, sid="s1")
        assert cached == 0 and not any(n for t, n in reader.kv.hit_tokens_by_tier.items() if t != "device")
        assert out == generate(fresh, first)[0]
        reader.check_integrity()
    finally:
        reader.close()
        fresh.close()


def test_the_same_memory_holds_more_quantised_blocks():
    def blocks(kv: str) -> int:
        cfg = EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=BLOCK,
                           kv_cache_memory="2MiB", kv_cache_dtype=kv)
        from hintkv.engine.llm_engine import LLMEngine

        e = LLMEngine(cfg)
        try:
            return e.num_blocks
        finally:
            e.close()

    f32, i8, f8 = blocks("auto"), blocks("int8"), blocks("fp8")
    assert i8 == f8
    assert 3.5 < i8 / f32 < 4.0  # head_dim bytes + a 4-byte scale per row vs 4 * head_dim


def test_bad_kv_cache_dtype_is_refused_naming_the_field(capsys):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int4")
    from hintkv.cli import main

    assert main(["serve", "--model", "dummy:tiny", "--kv-cache-dtype", "float8"]) == 2
    assert "kv_cache_dtype" in capsys.readouterr().err
