"""The live driver against a real `hintkv serve` (dummy:tiny): hints on the wire in the program's
order, and the offline replay agrees with the live run on hit rate within 3 points, under
either admission policy (the offline replay takes the live run's).

The capacity is the workload's working set: every live session's context fits, so what is hit
does not depend on timing (sessions still end, evicts still free, prompts still share). Under
pressure (half the working set) the live hit rate moved between 0.39 and 0.49 from run to run
on a loaded 2-core machine while the offline replay said 0.47 (fcfs); with cache-aware admission
in both, 0.46-0.59 live vs 0.55 offline at load 7-9: under pressure what is resident when a
request is admitted depends on how far the other requests got, i.e. on the machine's speed,
which the offline time model does not follow closely enough for 3 points."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hintkv.bench.common import ServerProcess, hintkv_server
from hintkv.replay import OfflineConfig, replay_offline
from hintkv.workload.agent import HintPlan, Manage, Run, Send, workload_programs
from hintkv.workload.live import replay_live
from hintkv.workload.traces import Scale
from hintkv.workload.users import build_workload

TRACES = Path("/work/shared/traces")
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="shared/traces not present")
BS = 16


@pytest.fixture(scope="module")
def workload():
    # a team: sub-agents, offloads (waits on teammates), prefetches and evicts all happen
    return build_workload("swe-team", TRACES / "swe-agent", 2, scale=Scale(1 / 32, max_calls=4), seed=5,
                          stagger_s=2.0)


def _expected_order(workload, plan):
    """Per session, the program's sends and hints in order (what the wire must show)."""
    out: dict[str, list[str]] = {}

    def walk(program):
        for e in program:
            if isinstance(e, Send):
                out.setdefault(e.session.session_id, []).append("send")
            elif isinstance(e, Manage):
                out.setdefault(e.session.session_id, []).append(e.action if e.token_start is None else "evict-range")
            elif isinstance(e, Run):
                for _, child in e.children:
                    walk(child)

    for _, user in workload_programs(workload, plan).children:
        walk(user)
    return out


@pytest.mark.parametrize("admission", ["fcfs", "cache-aware"])
def test_live_hints_in_order_and_offline_agrees(workload, admission):
    sizing = replay_offline(workload, OfflineConfig(policy="sam", hints=True, device_blocks=10**6))
    device = max(sizing.peak_held_blocks,
                 max(-(-(c.num_prompt_tokens + c.max_tokens) // BS) for t in workload.tasks()
                     for a in t.agents() for c in a.calls) + 1)
    args = ["--kv-cache-tokens", str(device * BS), "--block-size", str(BS), "--eviction-policy", "sam",
            "--max-num-seqs", "64", "--scheduling-policy", admission]
    plan = HintPlan(hints=True)
    with ServerProcess(hintkv_server("dummy:tiny", name="test-live", extra_args=args)) as srv:
        live = asyncio.run(replay_live(workload, srv.base_url, "dummy:tiny", plan, time_scale=50.0))
    assert live.num_errors == 0, [c.error for c in live.calls if c.error][:3]
    assert len(live.calls) == workload.num_calls
    assert all(ok == sent for sent, ok in live.actions.values()), live.actions
    got: dict[str, list[str]] = {}
    for _, kind, sid in live.events:
        got.setdefault(sid, []).append(kind)
    assert got == _expected_order(workload, plan)
    offline = replay_offline(workload, OfflineConfig(policy="sam", hints=True, device_blocks=device,
                                                     block_size=BS, time_scale=50.0, scheduling=admission))
    assert offline.prompt_tokens == live.prompt_tokens
    assert abs(offline.hit_rate - live.hit_rate) <= 0.03, (offline.hit_rate, live.hit_rate)
