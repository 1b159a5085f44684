"""`prefill-fair` (engine/admission_swap.py) on the real engine (dummy:tiny, a host tier): a new
prefill without room swaps a running decode out, as under `prefill-first`, but the displaced
decode is overtaken by at most `max_overtakes` new prefills (the one it made room for is the
first): then it goes back first and nothing
more is swapped while it waits. Under `prefill-first` every later newcomer goes first (and swaps
the decode it made room for out in turn). Outputs are always the ones a roomy device gives."""

from __future__ import annotations

import pytest
from tier_engine_helpers import BLOCK, prompt, run_arrivals, tiny_engine

from hintkv.engine.admission import make_admission

# (request, prompt, max_tokens, step it arrives): a decodes long; b, c, d each need 6 of the
# device's 8 blocks to their end, so b takes a's room and c, d find no room beside whoever runs
ARRIVALS = [("a", prompt(11, 4 * BLOCK), 40, 0), ("b", prompt(12, 5 * BLOCK), 4, 6),
            ("c", prompt(13, 5 * BLOCK), 4, 9), ("d", prompt(14, 5 * BLOCK), 4, 10)]


def run(engine) -> tuple[dict[str, list[int]], dict[str, int], dict[str, int]]:
    """(outputs, step of the first token, step of the end) per request."""
    return run_arrivals(engine, ARRIVALS)


def swapping_engine(policy: str, **kwargs):
    engine = tiny_engine(host_cache_memory="4MiB", scheduling_policy=policy, eviction_policy="sam")
    if kwargs:
        engine.scheduler.admission = make_admission(policy, max_model_len=engine.scheduler.max_model_len, **kwargs)
    return engine


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    return run(tiny_engine(kv_tokens=64 * BLOCK))[0]


def test_a_displaced_decode_goes_back_before_the_next_newcomer(reference):
    engine = swapping_engine("prefill-fair", max_overtakes=1)
    out, first, end = run(engine)
    assert out == reference
    assert first["b"] < end["a"], "b waited for the decode to finish: nothing was swapped"
    assert end["a"] < first["c"] and end["a"] < first["d"], "a later newcomer overtook the displaced decode"
    assert end["b"] < end["a"]  # b was not swapped out in turn while a waited
    assert engine.tier_stats()["blocks_moved"].get("host->device", 0) >= 2, "a was recomputed, not loaded back"


def test_max_overtakes_bounds_how_many_newcomers_go_first(reference):
    out, first, end = run(swapping_engine("prefill-fair", max_overtakes=2))
    assert out == reference
    assert first["b"] < end["a"] and first["c"] < end["a"] < first["d"]  # b made room, c went past; not d


def test_prefill_first_lets_every_newcomer_go_first(reference):
    engine = swapping_engine("prefill-first")
    out, first, end = run(engine)
    assert out == reference
    assert first["c"] < end["a"] and first["d"] < end["a"]
    assert engine.scheduler.num_preemptions >= 2  # and a newcomer swaps out the one before it


def test_bad_max_overtakes_is_refused():
    with pytest.raises(ValueError, match="max_overtakes"):
        make_admission("prefill-fair", max_overtakes=0)


def test_a_displaced_decode_admitted_is_not_overtaken_later_in_the_same_step():
    """A due displaced decode and then a new prefill admitted in one step: the prefill does not
    count as overtaking the decode (it no longer waits), and `check_integrity` holds after."""
    from hintkv.cache.manager import KVCacheManager
    from hintkv.cache.policies import make_policy
    from hintkv.engine.admission import StepPlan
    from tests.engine.test_scheduler import make_seq

    fair = make_admission("prefill-fair", max_overtakes=1)
    kv = KVCacheManager(16, BLOCK, make_policy("lru"))
    d, n = make_seq("d", prompt(1, BLOCK)), make_seq("n", prompt(2, BLOCK))
    d.first_token_time = 1.0  # it had its first token: a decode set aside
    fair.overtaken["d"] = 1
    assert fair.order([n, d], kv)[0] is d  # due: back first
    plan = StepPlan()
    fair.admitted(d, plan)
    fair.admitted(n, plan)
    assert "d" not in fair.overtaken
    fair.check_integrity()
