"""An agent script as a program of effects: what it sends, which hints, when it waits.

    program = user_program(user, HintPlan(hints=True))
    effect = next(program)          # Sleep / Send / Manage / Run; a driver carries it out,
    effect = program.send(result)   # then resumes the program with the result

The program is transport- and clock-independent: the live driver (`hintkv.workload.live`:
asyncio + HTTP), the offline replay (`hintkv.replay`: the cache code on a virtual clock) and the
simulator all run the same programs, so every run of a workload sends the same requests and the
same hints in the same order. Times in effects are trace seconds; a driver applies its time scale.

The hints follow shared/protocol/agent-hint.md section 3 (what openJiuwen agent-core sends):
- every `Send` carries the session identity (the driver leaves it out when hints are off);
- a session that waits on sub-agents, or on a tool at least `offload_after_s` long, is offloaded
  right after its call returns (the agent knows what it started: a test run, a sub-agent);
- before its next call an offloaded session is prefetched (the tool has returned);
- a call whose context was compressed first range-evicts the stale part (`token_start`);
- a sub-agent that ends is evicted; when a task ends its root is evicted (the whole tree).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

from hintkv.workload.program import AgentScript, Call, Task, User, Workload


@dataclass(frozen=True, slots=True)
class SessionId:
    session_id: str
    parent_session_id: str  # a root names itself


@dataclass(frozen=True, slots=True)
class Send:
    """One model call: `call.prompt_ids()` with exactly `call.max_tokens` out."""

    session: SessionId
    call: Call
    index: int  # the call's position in its agent's script
    task_id: str


@dataclass(frozen=True, slots=True)
class Manage:
    """A management request (no generation); `token_start` set: a range evict from there on."""

    session: SessionId
    action: Literal["evict", "offload", "prefetch"]
    token_start: int | None = None


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Run:
    """Run `children` concurrently (each after its delay) and wait at least `at_least_s`;
    the program resumes when all of it is done."""

    children: tuple[tuple[float, Program], ...]
    at_least_s: float = 0.0


Effect = Send | Manage | Sleep | Run
Program = Generator[Effect, Any, None]


@dataclass(frozen=True, slots=True)
class HintPlan:
    hints: bool = True
    offload_after_s: float = 2.0  # tool waits at least this long (trace seconds) offload


def agent_program(script: AgentScript, parent_id: str, task_id: str, plan: HintPlan) -> Program:
    me = SessionId(script.session_id, parent_id)
    is_root = script.session_id == parent_id
    offloaded = False
    last = len(script.calls) - 1
    for k, call in enumerate(script.calls):
        if plan.hints and k and call.stale_from is not None:
            yield Manage(me, "evict", call.stale_from)
        if offloaded:
            yield Manage(me, "prefetch")
            offloaded = False
        yield Send(me, call, k, task_id)
        if plan.hints and k < last and (call.spawns or call.wait_s >= plan.offload_after_s):
            yield Manage(me, "offload")
            offloaded = True
        if call.spawns:
            children = tuple((sp.delay_s, agent_program(sp.agent, script.session_id, task_id, plan))
                             for sp in call.spawns)
            yield Run(children, call.wait_s)
        elif call.wait_s > 0:
            yield Sleep(call.wait_s)
    if plan.hints and not is_root:
        yield Manage(me, "evict")


def task_program(task: Task, plan: HintPlan) -> Program:
    yield from agent_program(task.root, task.root.session_id, task.task_id, plan)
    if plan.hints:
        yield Manage(SessionId(task.root.session_id, task.root.session_id), "evict")


def user_program(user: User, plan: HintPlan) -> Program:
    """A user runs its tasks back to back (closed loop)."""
    for task in user.tasks:
        yield from task_program(task, plan)


def workload_programs(workload: Workload, plan: HintPlan) -> Run:
    """The whole workload as one `Run`: every user after its start delay."""
    return Run(tuple((u.start_s, user_program(u, plan)) for u in workload.users))
