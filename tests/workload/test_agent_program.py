"""The agent program sends the protocol's hints in the right order (agent-hint.md section 3)."""

from __future__ import annotations

from hintkv.workload.agent import HintPlan, Manage, Run, Send, Sleep, task_program
from hintkv.workload.program import AgentScript, Call, Spawn, Task


def _call(n: int, wait: float = 0.0, spawns=(), stale_from=None) -> Call:
    return Call(((1,) * n,), 4, wait, spawns, stale_from)


def _flatten(program, out, who="root"):
    """Run a program depth first (children in order); record effects as short strings."""
    for e in program:
        if isinstance(e, Send):
            out.append(f"send {e.session.session_id}/{e.session.parent_session_id} #{e.index}")
        elif isinstance(e, Manage):
            out.append(f"{e.action} {e.session.session_id}" + ("" if e.token_start is None else f" @{e.token_start}"))
        elif isinstance(e, Sleep):
            out.append(f"sleep {e.seconds}")
        elif isinstance(e, Run):
            out.append(f"run {len(e.children)} >= {e.at_least_s}")
            for _, child in e.children:
                _flatten(child, out)
    return out


def _task() -> Task:
    sub = AgentScript("T_sub_a", (_call(8, 1.0), _call(9)))
    root = AgentScript("T", (_call(4, 0.5), _call(5, 0.0, (Spawn(0.2, sub),)), _call(6, 30.0),
                             _call(7, 0.0, stale_from=2), _call(8)))
    return Task("T", "test", root)


def test_hint_order():
    got = _flatten(task_program(_task(), HintPlan(offload_after_s=2.0)), [])
    assert got == [
        "send T/T #0", "sleep 0.5",
        "send T/T #1", "offload T", "run 1 >= 0.0",  # waits on a sub-agent: offloaded first
        "send T_sub_a/T #0", "sleep 1.0", "send T_sub_a/T #1", "evict T_sub_a",  # a sub-agent ends
        "prefetch T", "send T/T #2", "offload T", "sleep 30.0",  # a long tool: offload, then prefetch
        "evict T @2", "prefetch T", "send T/T #3",  # compressed context: the stale range goes first
        "send T/T #4", "evict T",  # the task ends: its root (and tree) is evicted
    ]


def test_hints_off_sends_the_same_calls_and_nothing_else():
    on = [e for e in _flatten(task_program(_task(), HintPlan(True)), []) if e.startswith(("send", "sleep", "run"))]
    off = _flatten(task_program(_task(), HintPlan(False)), [])
    assert off == on
