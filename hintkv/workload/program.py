"""The replayed swarm as plain data: users -> tasks -> agent scripts -> calls.

    workload.users[0].tasks[0].root.calls[0].prompt_ids()  # token ids of a root agent's first call

An agent script is what one agent session does, in order: each `Call` sends a prompt (token
ids) and asks for exactly `max_tokens` tokens back (`ignore_eos`), then the agent starts the
sub-agents the call names (each after its own delay) and waits until its tool returns
(`wait_s`) AND every sub-agent it started has ended. A sub-agent is a child session of its
parent; a task is one root script (plus its children); a user runs its tasks back to back
(closed loop), after a start delay. Loaders (`hintkv.workload.traces`) build these from real
traces; `hintkv.workload.agent` turns a script into the protocol's requests and hints; drivers
(`hintkv.workload.live`, `hintkv.replay`, the simulator) decide how requests are served and
how time passes. Nothing here knows about hints, HTTP or clocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Call:
    """One model call of an agent, and what the agent does after it."""

    prompt: tuple[tuple[int, ...], ...]  # token ids of the whole context window sent, in chunks
    #                                      (blocks or messages, shared between calls: cheap to hold)
    max_tokens: int  # completion length (sent with ignore_eos)
    wait_s: float = 0.0  # tool time after the call (seconds, unscaled trace time)
    spawns: tuple[Spawn, ...] = ()  # sub-agents started after this call; the agent waits for them
    stale_from: int | None = None  # the context was compressed before this call: the previous
    #                                prompt's tokens from here on are stale (a range evict)
    tool: str | None = None  # the tool whose result the NEXT call carries (to learn tool gaps)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(c) for c in self.prompt)

    def prompt_ids(self) -> list[int]:
        return [tok for chunk in self.prompt for tok in chunk]


@dataclass(frozen=True, slots=True)
class Spawn:
    delay_s: float  # after the parent's call returns
    agent: AgentScript


@dataclass(frozen=True, slots=True)
class AgentScript:
    session_id: str
    calls: tuple[Call, ...]

    def walk(self) -> Iterator[AgentScript]:
        """This agent and every sub-agent below it, depth first."""
        yield self
        for call in self.calls:
            for sp in call.spawns:
                yield from sp.agent.walk()


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str  # unique in a workload (also the root session id)
    source: str  # the trace it came from (file name)
    root: AgentScript

    def agents(self) -> list[AgentScript]:
        return list(self.root.walk())

    @property
    def num_calls(self) -> int:
        return sum(len(a.calls) for a in self.agents())


@dataclass(frozen=True, slots=True)
class User:
    user_id: str
    start_s: float  # when the user's first task starts
    tasks: tuple[Task, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    users: tuple[User, ...]
    meta: dict = field(default_factory=dict)  # how it was built (loader, scales, seed)

    def tasks(self) -> list[Task]:
        return [t for u in self.users for t in u.tasks]

    @property
    def num_calls(self) -> int:
        return sum(t.num_calls for t in self.tasks())

    @property
    def prompt_tokens(self) -> int:
        return sum(c.num_prompt_tokens for t in self.tasks() for a in t.agents() for c in a.calls)
