"""Why the queue waited (`hintkv sim`'s `queue_why`, `StepStats.wait_s`): a call the room rule
refuses waits for room, even in steps whose token budget a running prefill fills.

The scene: the real scheduler under `srpt` (room reserved to each running prefill's end, as
`cache-aware`'s; nothing lent) on a 64-block device; an 800-token prefill `a` runs in 256-token
chunks and reserves 51 blocks; `b`, 300 tokens (19 blocks to its end), arrives during a's first
step: its key is better than a's, so a yields to it, but it has no room until a ends, and a takes
the step's whole budget back. b's wait after that first step is room, not budget (before the
mend every full step charged "budget")."""

from __future__ import annotations

import pytest

from hintkv.config import EngineConfig
from hintkv.sim.clock import EventClock
from hintkv.sim.engine import SimEngine

BS, DEVICE_BLOCKS, BUDGET = 16, 64, 256


def _submit(eng: SimEngine, clock: EventClock, rid: str, prompt: list[int], got: dict) -> None:
    eng.submit(rid, prompt, 1, None, lambda t: got.setdefault(rid, {}).update(first=t),
               lambda out, hashes: got.setdefault(rid, {}).update(queue_s=out.metrics.ttft_parts.queue_s))


def test_a_call_refused_for_room_waits_for_room_in_full_steps(costs):
    clock = EventClock()
    cfg = EngineConfig(model="sim", block_size=BS, kv_cache_tokens=DEVICE_BLOCKS * BS,
                       max_num_batched_tokens=BUDGET, eviction_policy="lru", hints=False,
                       scheduling_policy="srpt")
    eng = SimEngine(cfg, costs, clock, DEVICE_BLOCKS)
    chunks = []  # each step's (request id, tokens)
    schedule = eng.scheduler.schedule

    def recorded(unlocked=None):
        out = schedule(unlocked)
        chunks.append([(s.seq.request_id, s.num_new_tokens) for s in out.scheduled])
        return out
    eng.scheduler.schedule = recorded
    got: dict = {}
    _submit(eng, clock, "a", list(range(1, 801)), got)
    clock.run_next()  # a's first step is scheduled (its end is queued on the clock)
    clock.at(clock() + 1e-4, lambda: _submit(eng, clock, "b", list(range(10_000, 10_300)), got))
    while clock.run_next():
        pass
    assert chunks[:4] == [[("a", BUDGET)]] * 3 + [[("a", 800 - 3 * BUDGET)]]  # full steps, then a's end
    assert chunks[4] == [("b", BUDGET)]  # b runs once a's room is free
    wait = eng.stats.wait_s
    queued = got["a"]["queue_s"] + got["b"]["queue_s"]
    assert sum(wait.values()) == pytest.approx(queued, rel=1e-9, abs=1e-12)  # the causes split it
    assert wait["budget"] == 0  # (before: a's full steps charged b's wait to the budget)
    assert wait["step"] > 0 and wait["room"] > wait["step"]  # b waited for a's first step, then for room


def test_the_calls_behind_a_refused_head_wait_for_room_too(costs):
    """fcfs stops at the first call refused for room (`batching`: it and every one behind it wait
    for room): a's last chunk (1000 tokens: 63 of the 64 blocks) leaves b's chunk one block, so b
    and c behind it wait for room for that step; the causes still split the queue exactly, and the
    count is never above the calls waiting (the engine raises on a miscount)."""
    clock = EventClock()
    cfg = EngineConfig(model="sim", block_size=BS, kv_cache_tokens=DEVICE_BLOCKS * BS,
                       max_num_batched_tokens=BUDGET, eviction_policy="lru", hints=False,
                       scheduling_policy="fcfs")
    eng = SimEngine(cfg, costs, clock, DEVICE_BLOCKS)
    got: dict = {}
    rooms = []
    schedule = eng.scheduler.schedule

    def recorded(unlocked=None):
        out = schedule(unlocked)
        rooms.append(out.num_room_waits)
        return out
    eng.scheduler.schedule = recorded
    _submit(eng, clock, "a", list(range(1, 1001)), got)
    clock.run_next()
    clock.at(clock() + 1e-4, lambda: _submit(eng, clock, "b", list(range(10_000, 10_300)), got))
    clock.at(clock() + 2e-4, lambda: _submit(eng, clock, "c", list(range(20_000, 20_040)), got))
    while clock.run_next():
        pass
    assert rooms[:5] == [0, 0, 0, 2, 0]  # a's last chunk: b refused, c behind it
    wait = eng.stats.wait_s
    queued = sum(got[r]["queue_s"] for r in "abc")
    assert sum(wait.values()) == pytest.approx(queued, rel=1e-9, abs=1e-12)
    assert wait["room"] > 0 and wait["step"] > 0
