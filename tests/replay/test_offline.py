"""The offline replay runs the real cache code: consistent counts, sessions released, hints used."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hintkv.replay import OfflineConfig, replay_offline
from hintkv.replay.events import EventLoop
from hintkv.replay.offline import OfflineEngine
from hintkv.workload.agent import HintPlan, workload_programs
from hintkv.workload.traces import Scale
from hintkv.workload.users import build_workload

TRACES = Path("/work/shared/traces")
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="shared/traces not present")


@pytest.fixture(scope="module")
def team():
    return build_workload("swe-team", TRACES / "swe-agent", 2, scale=Scale(0.0625, max_calls=5), seed=1)


def test_counts_are_consistent(team):
    r = replay_offline(team, OfflineConfig(policy="sam", hints=True, device_blocks=300, host_blocks=900),
                       check_every=10)
    assert len(r.calls) == team.num_calls
    assert r.prompt_tokens == team.prompt_tokens
    for c in r.calls:
        assert 0 <= c.host_tokens <= c.hit_tokens < c.prompt_tokens
        assert c.ttft_s >= 0 and c.e2e_s >= c.ttft_s
    assert set(r.task_s) == {t.task_id for t in team.tasks()}


def test_hints_release_every_session_at_the_end(team):
    loop = EventLoop()
    engine = OfflineEngine(OfflineConfig(policy="sam", hints=True, device_blocks=400, host_blocks=800), loop)
    loop.start(workload_programs(team, HintPlan(True)), engine.send, engine.manage)
    loop.run()
    engine.check_integrity()
    assert engine.sessions.sessions  # every agent was seen as a session
    assert not engine.sessions.holders  # ...and every task's evict released all of them
    assert len(engine.host) == 0  # ended sessions' blocks left the host tier too
    assert engine.kv.pool.num_in_use == 0


def test_same_calls_hints_on_or_off(team):
    on = replay_offline(team, OfflineConfig(policy="sam", hints=True, device_blocks=300))
    off = replay_offline(team, OfflineConfig(policy="lru", hints=False, device_blocks=300))
    key = lambda r: sorted((c.session_id, c.index, c.prompt_tokens) for c in r.calls)
    assert key(on) == key(off)


def test_deferred_offload_and_exclusive_host_keep_fewer_host_blocks(team):
    """The host holds only what the device could not: an offload writes nothing until the device
    evicts the blocks, and a block read back leaves the host. Same hits, a lower peak, more writes."""
    base = OfflineConfig(policy="sam", hints=True, device_blocks=300, host_blocks=1200)
    inclusive = replay_offline(team, base)
    exclusive = replay_offline(team, replace(base, offload_mode="deferred", host_mode="exclusive"))
    assert exclusive.hit_rate >= inclusive.hit_rate - 0.01
    assert exclusive.peak_host_blocks < inclusive.peak_host_blocks
    with pytest.raises(ValueError, match="host_mode"):
        OfflineConfig(host_mode="both")
    with pytest.raises(ValueError, match="offload_mode"):
        OfflineConfig(offload_mode="later")


def test_each_access_records_the_device_blocks_its_request_held(team):
    """`Access.footprint` (what `belady_pinned` holds for a running request) is the block table the
    engine gave it: every full block of its prompt and completion, plus the partial last one."""
    r = replay_offline(team, OfflineConfig(policy="sam", hints=True, device_blocks=300))
    ran = [a for a in r.accesses if a.ended_before >= 0]
    extra = [a.footprint - len(set(a.prompt) | set(a.written)) for a in ran]
    assert ran and all(e in (0, 1) for e in extra)
    assert 1 in extra  # partial last blocks exist
    assert 0 in extra  # and a request whose tokens fill whole blocks holds none (never an extra block)


def test_a_serial_hold_admits_nobody_until_it_lapses(team):
    """`cache-aware-serial` (engine.admission_serial): when the admission holds every candidate that
    has no room for a returner, the replay admits nobody (it looks again when the hold lapses or at
    the next event), and every call is still served."""
    picks = []

    def observe(engine):
        pick = engine._pick

        def checked():
            got = pick()
            picks.append((engine.admission.held_until is not None, got is None))
            return got
        engine._pick = checked

    cfg = OfflineConfig(policy="sam", hints=True, device_blocks=60, scheduling="cache-aware-serial",
                        prefill_s_per_token=1e-2)  # a slow prefill: a short hold saves more than it costs
    r = replay_offline(team, cfg, observe=observe, check_every=10)
    assert len(r.calls) == team.num_calls
    assert any(none for _, none in picks)  # the hold stopped admission in this workload
    assert all(held for held, none in picks if none)  # only a hold does
    assert r.hit_rate > replay_offline(team, replace(cfg, scheduling="cache-aware")).hit_rate


def _looks(engine) -> list[tuple[float, int, float, float | None]]:
    """Record, after each look at the queue (`_admit`), (time, queued, prefill free at, when the
    hold lapses if the look ended because the admission held every candidate, else None)."""
    looks, held = [], [False]
    pick, admit = engine._pick, engine._admit

    def picked():
        got = pick()
        held[0] = got is None
        return got

    def looked():
        held[0] = False
        admit()
        lapse = engine.admission.held_until if held[0] else None
        looks.append((engine.loop.now, len(engine._queue), engine._prefill_free_at, lapse))
    engine._pick, engine._admit = picked, looked
    return looks


@pytest.fixture(scope="module")
def study_cell():
    """`bench policy_study`'s cell swe-agent seed 1, 10 users, 12 calls, device 0.1 of the peak
    working set (where the review of cache-aware-serial measured looks later than the time model)."""
    from hintkv.bench.swarm_pace import pace, reference_speed
    from hintkv.bench.swarm_study import size_workload

    wl = build_workload("swe-agent", TRACES / "swe-agent", 10, scale=Scale(1 / 16, max_calls=12), seed=1)
    base = OfflineConfig(block_size=16)
    base = replace(base, time_scale=pace(wl, reference_speed(base)))
    return wl, replace(base, device_blocks=size_workload(wl, base, {}).device_blocks(0.1))


def test_the_queue_is_looked_at_when_prefill_frees_and_when_a_hold_lapses(study_cell):
    """The replay's time model: a waiting request is looked at again the moment the prefill server
    is free (not at a later hold's lapse) and the moment the hold on it lapses (not at the next
    send or finish, which may never come: a returner that waits on the held request)."""
    wl, base = study_cell
    runs = []
    r = replay_offline(wl, replace(base, policy="sam", hints=True, scheduling="cache-aware-serial"),
                       observe=lambda e: runs.append(_looks(e)))
    assert len(r.calls) == wl.num_calls
    looks = runs[0]
    pairs = list(zip(looks, looks[1:]))
    waits = [(a, b) for a, b in pairs if a[1] and a[0] < a[2]]  # queued behind a busy prefill
    holds = [(a, b) for a, b in pairs if a[1] and a[3] is not None]  # queued behind a hold
    assert waits and holds  # both happen in this workload
    assert [a for a, b in waits if b[0] > a[2] + 1e-5] == []  # looked at again when the prefill frees
    assert [a for a, b in holds if b[0] > a[3] + 1e-5] == []  # ... and when the hold lapses
    assert not (looks[-1][1] and looks[-1][3] is not None)  # the last look left nothing held
