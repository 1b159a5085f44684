"""`LLMEngine.reset_prefix_cache` (vLLM's name): every cached device block no request uses is forgotten, the
blocks of a running request stay, and a lower tier keeps its copies (the tiers bench's recompute row)."""

from __future__ import annotations

from tier_engine_helpers import generate, prompt, session, settle, tiny_engine

from hintkv.cache.types import CacheEdit
from hintkv.engine.types import GenerateRequest, SamplingParams


def test_reset_forgets_cached_blocks_and_the_prompt_is_computed_again():
    engine = tiny_engine(kv_tokens=16 * 16)
    a = prompt(1)
    first, _ = generate(engine, a, "a")
    assert generate(engine, a, "a")[1] > 0  # matched on the device
    dropped = engine.reset_prefix_cache()
    assert dropped >= 4 and engine.kv.pool.num_cached_free == 0
    again, cached = generate(engine, a, "a")
    assert cached == 0 and again == first
    engine.check_integrity()
    engine.close()


def test_a_running_request_keeps_its_blocks():
    engine = tiny_engine(kv_tokens=16 * 16)
    engine.add_request(GenerateRequest("run", prompt(2), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))
    engine.step()  # prefilled: its blocks are in use
    in_use = engine.kv.pool.num_in_use
    assert in_use > 0
    engine.reset_prefix_cache()
    assert engine.kv.pool.num_in_use == in_use
    while engine.has_work():
        engine.step()
    engine.check_integrity()
    engine.close()


def test_a_lower_tier_keeps_its_copies():
    engine = tiny_engine(kv_tokens=16 * 16, host_cache_memory="4MiB", offload_mode="eager")
    a = prompt(3)
    generate(engine, a, "a")
    engine.manage(session("a"), [CacheEdit("offload")])
    settle(engine)
    engine.reset_prefix_cache()
    _, cached = generate(engine, a, "a")
    assert cached > 0 and engine.tier_stats()["hit_tokens"].get("host", 0) > 0
    engine.close()

