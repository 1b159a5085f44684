"""Decode stretches (`hintkv.sim.stretch`): running a stretch of decode-only steps as one clock event
gives the same result, figure by figure, as stepping each decode (`fast_decode=False`), on one
instance with and without hints and host tier, and on a cluster with the shared pool."""

from __future__ import annotations

import dataclasses

import pytest

from hintkv.sim.simulate import CONFIGS, simulate
from hintkv.sim.workload import build_workload


def _workload(traces: str, users: int, max_tasks: int):
    return build_workload([traces], users=users, seed=3, token_scale=0.05, max_calls=6,
                          max_tasks=max_tasks, stagger_s=5.0)


def _room(wl) -> int:
    return max(c.num_prompt_tokens + c.max_tokens for t in wl.tasks() for a in t.agents()
               for c in a.calls) + 64


def _everything(res) -> dict:
    """Every figure of a result but the wall clock and the clock's event count."""
    out = {f.name: getattr(res, f.name) for f in dataclasses.fields(res)
           if f.name not in ("wall_s", "num_events", "calls", "tasks", "accesses")}
    out["calls"] = [dataclasses.astuple(c) for c in res.calls]
    out["tasks"] = [dataclasses.astuple(t) for t in res.tasks]
    out["accesses"] = [dataclasses.astuple(a) for a in res.accesses]
    return out


@pytest.mark.parametrize("name,instances,block_size", [
    ("lru", 1, 16), ("lru+host", 1, 16), ("sam+hints+host", 1, 16), ("sam+hints+host", 1, 64),
    ("sam+hints+pool", 2, 16), ("sam+hints+pool+wt", 2, 16)])
def test_a_stretch_gives_the_same_result_as_each_step(traces, costs, name, instances, block_size):
    wl = _workload(traces, users=3 * instances, max_tasks=4 * instances)
    room = _room(wl) + 8 * block_size
    fast = simulate(wl, CONFIGS[name], costs, room, block_size=block_size, instances=instances)
    slow = simulate(wl, CONFIGS[name], costs, room, block_size=block_size, instances=instances,
                    fast_decode=False)
    assert fast.num_events < slow.num_events  # stretches ran
    assert _everything(fast) == _everything(slow)


def _trajectory(costs, fast: bool, users: int = 5, turns: int = 6, out: int = 400,
                tokens: int = 4096, spread: int = 5, stagger: float = 0.05,
                scheduling: str = "short-first") -> tuple[dict, object]:
    """`users` sessions of `turns` calls (`out`+ tokens out) after steady tool gaps, every odd one
    offloaded between calls, a host tier under a `tokens` device: the engine's state after the
    last event at each clock time (steps, counters, each live sequence)."""
    from hintkv.config import EngineConfig
    from hintkv.engine.types import CacheEdit, SessionRef
    from hintkv.sim.clock import EventClock
    from hintkv.sim.engine import SimEngine

    bs = 16
    cfg = EngineConfig(model="sim", block_size=bs, kv_cache_tokens=tokens, eviction_policy="sam",
                       hints=True, scheduling_policy=scheduling)
    clock = EventClock()
    eng = SimEngine(cfg, costs, clock, tokens // bs, host_blocks=4 * tokens // bs, fast_decode=fast)
    sch = eng.scheduler

    def send(i: int, turn: int) -> None:
        ref = SessionRef("t", f"s{i}", f"s{i}")
        prompt = [7 + i] * (200 + 37 * (i % spread)) + [9] * (150 * turn)

        def done(out, written) -> None:  # back after a steady tool gap; odd ones offloaded
            if i % 2:
                eng.manage(ref, [CacheEdit("offload")])
            if turn < turns - 1:
                clock.after(6.0 + 0.5 * i, lambda: send(i, turn + 1))

        eng.submit(f"r{i}.{turn}", prompt, out + 97 * (i % spread) + 7 * turn, ref, None, done)

    for i in range(users):
        clock.at(stagger * i, lambda i=i: send(i, 0))
    states = {}
    while clock.run_next():
        st = eng.stats
        seqs = tuple((rid, s.num_computed_tokens, len(s.token_ids), s.num_registered_blocks,
                      len(s.block_table), s.num_sent_tokens, s.last_token_time, s.peak_kv_blocks)
                     for rid, s in sorted(sch.requests.items()))
        states[clock()] = (st.num_steps, st.busy_s, st.num_batched_tokens, st.host_block_seconds,
                           st.peak_host_blocks, dict(st.wait_s), eng._wait, _admission_state(sch.admission),
                           sch.kv.pool.num_free, sch.kv.tiers.costs.prefill_s_per_token,
                           sch.kv.ranking.num_moves, sch.sam.num_predicted_prefetches, seqs)
    return states, eng


def _admission_state(policy) -> tuple:
    """What the admission policies count per step: short-first's steps, prefill-judged's costs."""
    costs = getattr(policy, "costs", None)
    return (getattr(policy, "step", None),
            None if costs is None else tuple(getattr(costs, f) for f in costs.__slots__))


@pytest.mark.parametrize("scheduling", ["short-first", "prefill-judged", "srpt-swap"])
def test_every_state_a_stretch_passes_through_is_the_stepped_one(costs, scheduling, monkeypatch):
    """At every clock event of the stretched run the engine is where stepping each decode has it
    at that time (a commit, an allocation or a policy step skipped inside a stretch shows here
    even when the final figures happen to agree). Every step feeds the tier cost model's prefill
    estimate here (its 64-token floor lowered to 1), so the stretch's replay of it is compared too."""
    monkeypatch.setattr("hintkv.cache.tier_costs.MIN_PREFILL_TOKENS", 1)
    slow, slow_eng = _trajectory(costs, fast=False, scheduling=scheduling)
    fast, fast_eng = _trajectory(costs, fast=True, scheduling=scheduling)
    assert fast_eng.stats.num_stretches > 0 and len(fast) < len(slow)
    assert set(fast) <= set(slow)
    for t, state in fast.items():
        assert state == slow[t], t
    assert fast_eng.stats.num_steps == slow_eng.stats.num_steps

