"""The eviction audit observes a real replay without changing it, and its counts add up."""

from __future__ import annotations

from pathlib import Path

import pytest

from hintkv.replay import OfflineConfig, replay_offline
from hintkv.replay.audit import audit_evictions
from hintkv.workload.traces import Scale
from hintkv.workload.users import build_workload

TRACES = Path("/work/shared/traces")
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="shared/traces not present")


@pytest.fixture(scope="module")
def swarm():
    return build_workload("claude-code", TRACES / "claude-code", 4, scale=Scale(0.0625, max_calls=8), seed=0)


@pytest.mark.parametrize("policy,hints", [("sam", True), ("sam-dist", True), ("lru", False)])
def test_audit_changes_nothing_and_adds_up(swarm, policy, hints):
    cfg = OfflineConfig(policy=policy, hints=hints, device_blocks=1100)
    memo: dict = {}
    plain = replay_offline(swarm, cfg, memo)
    a = audit_evictions(swarm, cfg, memo)
    assert a.hit_rate == plain.hit_rate  # the audited replay is the same replay
    assert a.evicted > 0  # the pool was under pressure
    assert 0 <= a.wrong <= a.evicted
    assert sum(a.causes.values()) == sum(a.instead.values()) == a.wrong
    s = a.summary()
    assert 0.0 <= s["wrong_hit_rate"]
    assert sum(r["wrong"] for r in a.rows()) == a.wrong


def test_lru_gives_away_hits_belady_keeps(swarm):
    """Under LRU with hints off no live session holds anything, so every wrong victim is an
    unheld block read again, and LRU's thrash makes some."""
    a = audit_evictions(swarm, OfflineConfig(policy="lru", hints=False, device_blocks=1100))
    assert a.wrong > 0
    assert set(a.causes) == {"unheld, read again"}
