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
