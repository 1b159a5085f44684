"""The collector's serving setting (`engine.gc_tuning`): `serve`'s engine start applies it, and it
stays a bound (cyclic garbage is still reclaimed once the young threshold is reached)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from hintkv.config import EngineConfig
from hintkv.engine.gc_tuning import SERVING_GEN0_THRESHOLD, restore, tune_for_serving
from hintkv.server.launch import start_engine


@pytest.fixture
def default_gc() -> Iterator[tuple[int, int, int]]:
    """Run the test from CPython's default setting and leave it as it was."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    try:
        yield before
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def test_serve_engine_start_sets_the_serving_collector(default_gc: tuple[int, int, int]) -> None:
    engine = start_engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu",
                                       block_size=16, kv_cache_tokens=256, max_model_len=128,
                                       max_num_seqs=2))
    try:
        assert gc.isenabled()
        assert gc.get_threshold() == (SERVING_GEN0_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0  # the start-up heap (the engine's blocks, modules)
    finally:
        asyncio.run(engine.shutdown())


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_serving_threshold_still_reclaims_cycles(default_gc: tuple[int, int, int]) -> None:
    before = tune_for_serving()
    assert before == (700, 10, 10)
    assert 700 < gc.get_threshold()[0] == SERVING_GEN0_THRESHOLD
    node = _Node()
    ref = weakref.ref(node)
    del node
    collections = gc.get_stats()[0]["collections"]
    junk = 0
    while ref() is not None and junk <= 2 * SERVING_GEN0_THRESHOLD:
        _Node()  # garbage cycles: each one counts as a young allocation until collected
        junk += 1
    assert ref() is None  # a gen0 collection ran on its own and freed the cycle
    assert gc.get_stats()[0]["collections"] > collections
    assert junk > SERVING_GEN0_THRESHOLD // 4  # not before the serving threshold's worth
    restore(before)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0
