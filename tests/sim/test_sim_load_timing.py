"""Same-step load timing in the simulator (`engine.load_timing`, `Mover.wait_done`): the real
scheduler waits inside `schedule()` for a host hit's load, in simulated time, and computes it in
that step; under next-step the same hit computes one step later. A request that reaches the engine
while its step waits is added after the step is scheduled (the live engine thread's inbox); an
edit applies at once (the live wait runs with the state lock released)."""

from __future__ import annotations

import pytest

from hintkv.config import EngineConfig
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import CacheEdit, SamplingParams, SessionRef
from hintkv.sim.clock import EventClock
from hintkv.sim.engine import SimEngine

BS, DEVICE_BLOCKS, BUDGET = 16, 256, 2048
A = list(range(1, 1 + 64 * BS))  # 64 blocks, later evicted to the host tier
D = list(range(100_000, 100_000 + 200 * BS))  # with F, pushes A off the device (lru: A first)
F = list(range(500_000, 500_000 + 100 * BS))
C = list(range(200_000, 200_000 + 1500))  # a prefill beside which A's continuation arrives


def _engine(costs, timing: str, clock: EventClock | None = None) -> tuple[SimEngine, EventClock, list, dict]:
    clock = EventClock() if clock is None else clock
    cfg = EngineConfig(model="sim", block_size=BS, kv_cache_tokens=DEVICE_BLOCKS * BS,
                       max_num_batched_tokens=BUDGET, eviction_policy="lru", hints=False,
                       load_timing=timing)
    eng = SimEngine(cfg, costs, clock, DEVICE_BLOCKS, host_blocks=4 * DEVICE_BLOCKS)
    steps = []  # each step's scheduled request ids, its start (after any wait) and when scheduled
    schedule = eng.scheduler.schedule

    def recorded(unlocked=None):
        t0 = clock()
        out = schedule(unlocked)
        steps.append(([s.seq.request_id for s in out.scheduled], out.started, t0))
        return out
    eng.scheduler.schedule = recorded
    added = {}  # request id -> (its sequence, when the scheduler got it)
    add = eng.scheduler.add_request

    def add_recorded(seq):
        add(seq)
        added[seq.request_id] = (seq, clock())
    eng.scheduler.add_request = add_recorded
    return eng, clock, steps, added


def _run(eng: SimEngine, clock: EventClock, rid: str, prompt: list[int], max_tokens: int = 1) -> dict:
    got = {}
    eng.submit(rid, prompt, max_tokens, None, lambda t: got.setdefault("first", t),
               lambda out, hashes: got.update(done=clock(), queue_s=out.metrics.ttft_parts.queue_s))
    return got


def _drain(clock: EventClock) -> None:
    while clock.run_next():
        pass


@pytest.mark.parametrize("timing", ["next-step", "same-step"])
def test_a_host_hit_computes_in_the_step_its_load_starts_under_same_step(costs, timing):
    eng, clock, steps, added = _engine(costs, timing)
    runs = [_run(eng, clock, "a", A)]
    _drain(clock)
    for rid, prompt in (("d", D), ("f", F)):
        runs.append(_run(eng, clock, rid, prompt))
        _drain(clock)
    b_prompt = A + list(range(300_000, 300_000 + BS))  # A's prefix, all of it on the host tier
    probe = Sequence("probe", b_prompt, len(b_prompt), SamplingParams(max_tokens=1), eng.root)
    match = eng.kv.match_prefix(probe)
    assert not match.blocks and len(match.lower) == 64
    first = len(steps)
    c = _run(eng, clock, "c", C)
    b = _run(eng, clock, "b", b_prompt)
    t0 = clock()
    late = {}

    def arrive():  # an agent's call and an edit while the step may wait for b's load
        late["at"] = clock()
        late["e"] = _run(eng, clock, "e", list(range(400_000, 400_000 + 64)))
        late["edit"] = eng.manage(SessionRef("t", "s", "s"), [CacheEdit("offload")])
    clock.at(t0 + 1e-4, arrive)
    _drain(clock)
    assert eng.kv.tiers.counters.num_loaded == 64  # b's prefix came back from the host tier
    ids, started, scheduled_at = steps[first]
    assert scheduled_at == t0
    load_s = 64 * eng.kv.tiers.stack.mover.transfer_s("host->device", 1, idle=False)
    if timing == "same-step":
        assert ids == ["c", "b"]  # b computes in the step its load started,
        assert started >= t0 + load_s > late["at"]  # after waiting for the copy; e came meanwhile
        assert "e" in steps[first + 1][0]  # held until the step was scheduled: in the next one
        assert b["first"] <= steps[first + 1][1]  # b's first token: the first step's end
        assert added["e"][1] == started and added["e"][0].arrival == late["at"]  # keeps its time
        assert [o.reason for o in late["edit"]] == ["hints_ignored"]  # applied at once (lru)
    else:
        assert ids == ["c"] and started == t0  # no wait: b computes in the next step
        assert "b" in steps[first + 1][0] and b["first"] > steps[first + 1][1]
    assert eng.kv.tiers.counters.load_wait_s == pytest.approx(started - t0)
    assert c["first"] <= b["first"] and late["e"]["first"] > late["at"]
    # why the queue waited (queue_why): its causes split exactly the calls' summed admission wait,
    # e's time held during the wait included (charged to "step": it arrived during a step)
    queued = sum(r["queue_s"] for r in (*runs, c, b, late["e"]))
    assert sum(eng.stats.wait_s.values()) == pytest.approx(queued, rel=1e-9, abs=1e-12)


def test_the_load_timing_moves_nothing_without_loads_and_repeats_for_a_seed(traces, costs):
    """lru has no lower tier, so no load: same-step gives next-step's report field by field; and a
    same-step run with waits (lru+host, a device that binds) is the same run twice. (Not
    sam+hints+host: there each reload is a prefetch hint's, which its call waits for, so it has no
    load of its own to wait for: tests/engine/test_scheduler_prefetch_wait.py.)"""
    from test_sim_stretch import _everything, _room, _workload

    from hintkv.sim.simulate import CONFIGS, simulate

    wl = _workload(traces, users=3, max_tasks=4)
    room = _room(wl) + 8 * BS
    runs = {t: simulate(wl, CONFIGS["lru"], costs, room, load_timing=t) for t in ("next-step", "same-step")}
    assert _everything(runs["next-step"]) == _everything(runs["same-step"])
    a, b = (simulate(wl, CONFIGS["lru+host"], costs, room, load_timing="same-step") for _ in "ab")
    assert _everything(a) == _everything(b)
    assert a.load_waits > 0  # the run waited
    queued = sum(c.ttft_parts["queue_s"] for c in a.calls)  # queue_why splits the admission wait
    assert sum(a.wait_s.values()) == pytest.approx(queued, rel=1e-6, abs=1e-9)
