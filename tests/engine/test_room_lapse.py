"""A skipped candidate's kept prefix lapses when its wait for room is longer than its reload
(`engine.room_wait.lapses`, checked in `batching.admit_waiting`): the real Scheduler, KV manager
and the simulator's tiers, hints off (the rule is engine knowledge: lru runs get it too), no model.

The scene: a long cold prefill A runs; B's next call, whose 30-block prefix is cached, waits for
room until A ends; a short call D arrives behind it in srpt's order. The admission keeps B's
resident prefix from D, so with it kept D waits for A's end. When A's remaining prefill takes
longer than reloading B's prefix, holding the blocks idle costs more than getting them back:
the prefix lapses and D runs while A still prefills. When the reload costs more than the wait
(a slow tier), B keeps its prefix and D waits.
"""

from __future__ import annotations

import pytest

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.types import SessionRef
from hintkv.engine import batching
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams
from hintkv.sim.clock import EventClock
from hintkv.sim.costs import CostModel
from hintkv.sim.profile import load_profile
from hintkv.sim.tiers import sim_tiers
from tests.engine.scheduler_helpers import BS, ROOT

B_PREFIX = 120  # B's first prompt: 30 blocks cached
NUM_BLOCKS = 63  # A's 31 blocks to its end + B's 30 kept + 2: neither B (5 more) nor D (3) fits
PREFILL_S_PER_TOKEN = 1.0  # A's ~104 tokens left when B waits: ~104 s; B's recompute 4 s a block
FAST_LOAD_S = 1e-3  # a block from the host tier: 30 ms for B's prefix, far below the wait
SLOW_LOAD_S = 1e3  # slower than recomputing: B's prefix costs 120 s to get back, above the wait


def _seq(rid: str, sid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, tokens, len(tokens), SamplingParams(temperature=0, max_tokens=2), ROOT,
                    session=SessionRef("t", sid, sid))


def _run(load_s: float) -> tuple[dict[str, float], dict[str, int]]:
    """The scene; returns each scene call's first-token time and its cached prompt tokens."""
    clock = EventClock()
    kv = KVCacheManager(NUM_BLOCKS, BS, make_policy("lru"))
    kv.tiers = sim_tiers(kv, False, 64, clock, CostModel(load_profile("h200-llama3-8b")))
    sch = Scheduler(kv, 8, 16, clock=clock, admission="srpt")

    def step(dt: float) -> None:
        out = sch.schedule()
        kv.flush_write_downs()
        sch.update_from_output(out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
        clock.run_until(clock() + dt)

    b_tokens = list(range(1000, 1000 + B_PREFIX))
    sch.add_request(_seq("b0", "b", b_tokens))
    while sch.has_work():
        step(0.5)
    costs = kv.tiers.costs  # the engine's measured costs (set: no forward pass measures them here)
    costs.prefill_s_per_token = PREFILL_S_PER_TOKEN
    costs.bandwidth["host"] = costs.block_bytes / load_s
    a = _seq("a", "a", list(range(3000, 3120)))  # 30 blocks, cold: 8 steps of 16 tokens
    b = _seq("b1", "b", b_tokens + [7, 7] + list(range(4000, 4016)))
    d = _seq("d", "d", list(range(5000, 5010)))
    sch.add_request(a)
    step(0.1)
    sch.add_request(b)
    first: dict[str, float] = {}
    cached: dict[str, int] = {}
    for i in range(30):
        if i == 4:  # behind B in srpt's order (B's deadline passed first)
            sch.add_request(d)
        step(0.1)
        for s in (a, b, d):
            if s.request_id not in first and s.num_output_tokens:
                first[s.request_id] = clock()
                cached[s.request_id] = s.num_cached_tokens
        if not sch.has_work():
            break
    kv.check_integrity()
    assert set(first) == {"a", "b1", "d"}
    return first, cached


def test_a_wait_longer_than_the_reload_lets_the_prefix_lapse_and_the_short_call_runs():
    first, _ = _run(FAST_LOAD_S)
    assert first["d"] < first["a"]  # D took room B's prefix held, while A still prefilled
    assert first["a"] < first["b1"]  # B got its room once A ended


def test_a_wait_shorter_than_the_reload_keeps_the_prefix():
    first, cached = _run(SLOW_LOAD_S)
    assert first["a"] < first["d"]  # D waited for A's end: B's prefix stayed kept from it
    assert cached["b1"] == B_PREFIX  # and B found all of it on the device


@pytest.mark.parametrize("load_s", [FAST_LOAD_S, SLOW_LOAD_S])
def test_without_the_lapse_the_short_call_waits_for_the_long_prefill(monkeypatch, load_s):
    """The rule off: whatever the reload costs, B's prefix is kept and D waits for A's end."""
    monkeypatch.setattr(batching, "lapses", lambda *args: False)
    first, cached = _run(load_s)
    assert first["a"] < first["d"]
    assert cached["b1"] == B_PREFIX
