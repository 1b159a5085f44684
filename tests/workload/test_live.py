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
from hintkv.engine.types import TtftParts
from hintkv.replay import OfflineConfig, replay_offline
from hintkv.server.serve_times import SERVE_PARTS
from hintkv.workload.agent import HintPlan, Manage, Run, Send, workload_programs
from hintkv.workload.live import replay_live
from hintkv.workload.program import AgentScript, Call, Task, User, Workload
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
    for c in live.calls:  # the engine's TTFT parts, the server's around them, the driver's own
        assert set(c.ttft_parts) == {*TtftParts.FIELDS, *SERVE_PARTS, "client_send_s"}
        assert min(c.ttft_parts.values()) >= 0
        # the parts are disjoint pieces of the client's TTFT: together never more than it
        assert sum(c.ttft_parts.values()) <= c.ttft_s + 1e-3, (c.ttft_parts, c.ttft_s)
    got: dict[str, list[str]] = {}
    for _, kind, sid in live.events:
        got.setdefault(sid, []).append(kind)
    assert got == _expected_order(workload, plan)
    offline = replay_offline(workload, OfflineConfig(policy="sam", hints=True, device_blocks=device,
                                                     block_size=BS, time_scale=50.0, scheduling=admission))
    assert offline.prompt_tokens == live.prompt_tokens
    assert abs(offline.hit_rate - live.hit_rate) <= 0.03, (offline.hit_rate, live.hit_rate)


def _blocks(seed: int, n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(range(1000 + 100 * (seed + i), 1000 + 100 * (seed + i) + BS)) for i in range(n))


def test_live_range_evict_of_a_compressed_context_frees_exactly_the_stale_blocks():
    """A context compressed between two calls (`stale_from`): the driver sends the `tokens` range
    evict, waits for it, then the call; the server frees the previous window's blocks from the
    stale block on, and nothing of the kept prefix or of another session sharing it."""
    a, b, fresh = _blocks(0, 6), _blocks(10, 2), _blocks(20, 2)
    stale_from = 2 * BS + 3  # inside block 2: blocks 0-1 stay, 2-5 are stale
    root = AgentScript("cmp", (Call(a, 4, wait_s=0.1), Call(a[:2] + fresh, 4, stale_from=stale_from),
                               Call(a[:2] + fresh + b, 4)))
    other = AgentScript("other", (Call(a[:3] + b, 4, wait_s=10.0), Call(a[:3] + b + fresh, 4)))  # shares blocks 0-2
    # `other` starts first, so it holds blocks 0-2 (from its call's end) when `cmp` range-evicts: its tool
    # wait outlasts `cmp`'s first call by seconds even on a loaded box (at 2.0 s a stalled call let `other`
    # end first and free its blocks: one failure at load 13-30, review_rev24)
    workload = Workload("compressed", (User("u0", 1.0, (Task("cmp", "hand", root),)),
                                       User("u1", 0.0, (Task("other", "hand", other),))))
    args = ["--kv-cache-tokens", str(64 * BS), "--block-size", str(BS), "--eviction-policy", "sam"]
    plan = HintPlan(hints=True)
    with ServerProcess(hintkv_server("dummy:tiny", name="test-live-range", extra_args=args)) as srv:
        live = asyncio.run(replay_live(workload, srv.base_url, "dummy:tiny", plan, time_scale=1.0))
    assert live.num_errors == 0, [c.error for c in live.calls if c.error][:3]
    assert live.actions["evict-range"] == [1, 1]
    order = [kind for _, kind, sid in live.events if sid == "cmp"]
    assert order == _expected_order(workload, plan)["cmp"] == ["send", "evict-range", "send", "send", "evict"]
    [(done_t, sid, edit)] = live.range_edits
    assert sid == "cmp" and edit["action"] == "evicted" and edit["token_start"] == stale_from
    # the previous window held 6 prompt blocks (+ no full output block): 2-5 were this session's;
    # block 2 is also held by `other` (waiting on its tool then), so exactly 3 left the device
    assert edit["tiers"]["device"]["blocks"] == -3, edit
    second = [t for t, kind, s in live.events if s == "cmp" and kind == "send"][1]
    assert done_t <= second  # the evict was applied before the call it precedes was sent
    calls = sorted((c for c in live.calls if c.session_id == "cmp"), key=lambda c: c.call_index)
    assert calls[1].cached_tokens == 2 * BS  # the kept prefix still hits
