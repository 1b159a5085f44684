"""The swarm generator: deterministic per seed, shaped like the brief says (leaders, sub-agents
forked from the leader's window, growing windows, positive tool waits), and plain data."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from hintkv.workload.swarm import TASK_TOOL, Dist, SwarmShape, generate_swarm


@pytest.fixture(scope="module")
def swarm():
    return generate_swarm(seed=7)


def test_same_seed_same_swarm_other_seed_other_swarm(swarm):
    assert generate_swarm(seed=7) == swarm
    other = generate_swarm(seed=8)
    assert other != swarm
    assert other.tasks[0].leader.calls[0].messages != swarm.tasks[0].leader.calls[0].messages


def test_is_plain_json_data(swarm):
    for agent in swarm.agents():
        for call in agent.calls:
            json.dumps(call.messages)
    json.dumps(swarm.tools)


def test_tasks_leaders_and_subagents(swarm):
    shape = swarm.shape
    assert len(swarm.tasks) == shape.num_tasks == 10
    for task in swarm.tasks:
        leader = task.leader
        assert leader.is_root and leader.parent_session_id == leader.session_id == task.task_id
        assert shape.min_subagents <= len(task.subagents) <= shape.max_subagents
        spawned = [sid for call in leader.calls for sid in call.spawns]
        assert spawned == [s.session_id for s in task.subagents]  # each sub-agent started exactly once
        for k, sub in enumerate(task.subagents):
            assert sub.session_id == f"{leader.session_id}_sub_{k}"
            assert sub.parent_session_id == leader.session_id and not sub.is_root
            assert len(sub.calls) >= 2


def test_all_tasks_share_system_prompt_and_tools(swarm):
    for agent in swarm.agents():
        first = agent.calls[0].messages[0]
        assert first == {"role": "system", "content": swarm.system_prompt}
    assert swarm.tools[0]["function"]["name"] == TASK_TOOL
    assert len({t["function"]["name"] for t in swarm.tools}) == len(swarm.tools)


def test_subagents_start_from_the_leaders_window(swarm):
    for task in swarm.tasks:
        for call in task.leader.calls:
            for sid in call.spawns:
                sub = task.agent(sid)
                first = sub.calls[0].messages
                assert sub.fork_messages >= 2  # at least the system prompt and the user's task
                assert first[:sub.fork_messages] == call.messages[:sub.fork_messages]
                assert first[sub.fork_messages]["role"] == "user"  # then its own instruction
                assert len(first) == sub.fork_messages + 1


def test_windows_grow_by_appending(swarm):
    for agent in swarm.agents():
        for before, after in zip(agent.calls, agent.calls[1:]):
            assert after.messages[:len(before.messages)] == before.messages
            added = after.messages[len(before.messages):]
            assert added[0]["role"] == "assistant" and added[0]["tool_calls"]
            assert [m["role"] for m in added[1:]] == ["tool"] * len(added[0]["tool_calls"])


def test_subagent_answers_come_back_to_the_leader(swarm):
    for task in swarm.tasks:
        final = task.leader.calls[-1].messages
        results = [m["content"] for m in final if m["role"] == "tool"]
        for sub in task.subagents:
            assert sub.final_answer and sub.final_answer in results


def test_tool_waits_positive_and_suspensions(swarm):
    shape = swarm.shape
    for agent in swarm.agents():
        *middle, last = agent.calls
        assert last.tool_wait_s == 0 and not last.spawns and not last.suspend
        for call in middle:
            if call.spawns:  # the leader waits for its sub-agents, suspended
                assert call.suspend and call.tool_wait_s == 0
            else:
                assert call.tool_wait_s > 0
                assert call.suspend == (call.tool_wait_s >= shape.long_wait)
        assert all(c.max_tokens >= 1 for c in agent.calls)


def test_quick_shape_has_shorter_agents():
    full, quick = generate_swarm(3), generate_swarm(3, SwarmShape().quick())
    assert len(quick.tasks) == len(full.tasks)
    assert quick.num_calls < full.num_calls


def test_scales_apply():
    slow = generate_swarm(1, SwarmShape(time_scale=1.0))
    fast = generate_swarm(1, SwarmShape(time_scale=10.0))
    waits = lambda s: sum(c.tool_wait_s for a in s.agents() for c in a.calls)
    assert waits(slow) == pytest.approx(10 * waits(fast))


def test_dist_is_clipped_and_centered():
    d = Dist(10, 40, 2, 50)
    rng = random.Random(0)
    xs = sorted(d.sample(rng) for _ in range(4000))
    assert xs[0] >= 2 and xs[-1] <= 50
    assert 8.5 < xs[len(xs) // 2] < 11.5
    with pytest.raises(ValueError):
        Dist(10, 5, 1, 20)
    with pytest.raises(ValueError):
        replace(SwarmShape(), min_subagents=4, max_subagents=3)
