"""A closed engine that nobody holds is freed at once, by reference counting: its model's weights and its KV cache
go with it, not at the cyclic collector's next full collection. A process that builds and drops engines (a
benchmark's variants, the tests) otherwise held every dropped model until then: the model and its fused decode
call (models/decode_layers.py) referred to each other, and tests/engine peaked at 12.7 GB RSS with up to 22 dead
dummy:tiny models waiting; with lower tiers, the tier connector's links held the device KV cache and the host
tier's memory the same way."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, SamplingParams

CFG = dict(model="dummy:tiny", dtype="float32", device="cpu", block_size=16, kv_cache_tokens=256,
           max_model_len=128, max_num_seqs=2)


@contextmanager
def _no_collector() -> Iterator[None]:
    """Only reference counting frees anything inside (what the cyclic collector would free stays)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _refs(engine: LLMEngine) -> list[weakref.ref]:
    """The engine, its model, the model's weights, the KV cache tensors and the lower tiers (their memory)."""
    model = engine.runner.model
    tiers = [] if engine.tiers is None else [engine.tiers, *engine.tiers.stack.tiers]
    return [weakref.ref(engine), weakref.ref(model), *(weakref.ref(p) for p in model.parameters()),
            *(weakref.ref(kv) for kv in engine.runner.kv_caches), *map(weakref.ref, tiers)]


def _alive(refs: list[weakref.ref]) -> list[str]:
    return [type(obj).__name__ for obj in (r() for r in refs) if obj is not None]


def _run_one(engine: LLMEngine) -> None:
    engine.add_request(GenerateRequest("r", list(range(100, 120)), SamplingParams(
        temperature=0, max_tokens=3, ignore_eos=True)))
    while engine.has_work():
        engine.step()


def _built_and_dropped(build: Callable[[], LLMEngine]) -> list[weakref.ref]:
    engine = build()
    _run_one(engine)  # a few-row step: the model's fused decode call ran
    refs = _refs(engine)
    engine.close()
    return refs


def test_engines_built_and_closed_in_a_loop_are_freed_without_the_collector():
    with _no_collector():
        for i in range(3):
            refs = _built_and_dropped(lambda: LLMEngine(EngineConfig(**CFG, seed=i)))
            alive = _alive(refs)
            assert not alive, f"engine {i}: {len(alive)} of {len(refs)} objects outlive it: {alive[:3]}"


@pytest.mark.parametrize("tiers", ["host+disk", "pool"])
def test_a_closed_engine_with_lower_tiers_is_freed_without_the_collector(tiers, tmp_path):
    """The tier connector plugs itself into the device pool (eviction hook), the stack (keep rule) and each tier
    (rank board), and the stack into each tier (eviction listener): `close` unplugs them, or each link is a cycle
    that holds the device KV cache and the host tier's memory."""
    opts = ({"host_cache_memory": "4MiB", "disk_cache_dir": str(tmp_path / "kv"), "disk_cache_size": "4MiB"}
            if tiers == "host+disk" else {"pool": "embedded", "pool_dir": str(tmp_path / "pool"), "pool_size": "4MiB"})
    with _no_collector():
        refs = _built_and_dropped(lambda: LLMEngine(EngineConfig(**CFG, **opts)))
        assert len(refs) > 60  # the connector and its tiers among them
        alive = _alive(refs)
        assert not alive, f"{len(alive)} of {len(refs)} objects outlive the closed engine: {alive[:3]}"


def test_an_async_engine_shut_down_is_freed_without_the_collector():
    with _no_collector():
        llm = AsyncLLM.from_config(EngineConfig(**CFG))
        llm.call(_run_one).result(timeout=120)
        refs = [weakref.ref(llm), *_refs(llm.engine)]
        asyncio.run(llm.shutdown())
        del llm
        alive = _alive(refs)
        assert not alive, f"{len(alive)} of {len(refs)} objects outlive the shut-down engine: {alive[:3]}"
