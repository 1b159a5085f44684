"""A seeded agent-swarm workload as plain data: tasks -> agents -> calls.

    swarm = generate_swarm(seed=0)                  # SwarmShape() defaults; SwarmShape().quick()
    for task in swarm.tasks:
        task.leader.calls[0].messages               # the chat window of the leader's first call

Each task has a leader (a root session: its parent is itself) that works in phases of tool
calls; between phases it starts a wave of sub-agents with a task tool (`{leader}_sub_{k}`,
parent = the leader) and waits for all of them, suspended. A sub-agent's window starts from the
leader's: the shared system prompt and tools plus part of the leader's conversation, then its
own instruction. Every agent's context grows each call by its completion and a tool output, with
a tool wait between calls; a sub-agent ENDS after its last call (the replay sends an `evict`
session hint) and its final answer comes back to the leader as the task tool's result. At the
end the leader's tree is evicted. All tasks share one system prompt and one tool list, so the
shared prefix is hot for everyone.

Shapes come from the real traces in /work/shared/traces (Claude Code sessions with sub-agents,
mini-swe-agent runs), scaled down to fit a 2-core CPU: tokens / 64, seconds / 10, and calls
merged (2 real sub-agent calls per replayed one, 6 real leader calls' context growth per
replayed one); see `SwarmShape` field by field, and docs/benchmarks/history/sessions.md.

The generator only decides *what* is sent and how long tools take; `hintkv.workload.replay`
decides *when*, from the calls' tool waits and the server's answers.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace

from hintkv.client.identity import sub_agent_id
from hintkv.workload.text import tool_call, tool_schema, words

_Z90 = 1.2815515655446004  # the standard normal's 90th percentile
TASK_TOOL = "task"  # the tool a leader calls to start sub-agents (Claude Code's Task tool)
TOOLS_PREAMBLE_TOKENS = 110  # what hintkv's chat template adds around tool schemas (SmolLM2 tokens)


def _sum_of(dist: Dist, rng: random.Random, calls: float) -> float:
    """The sum of round(calls) draws (at least one): a merged call's growth or wait."""
    return sum(dist.sample(rng) for _ in range(max(1, round(calls))))


@dataclass(frozen=True, slots=True)
class Dist:
    """A log-normal given by its median and 90th percentile, clipped to [low, high]."""

    p50: float
    p90: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 < self.p50 <= self.p90:
            raise ValueError(f"need 0 < p50 <= p90, got {self.p50}, {self.p90}")
        if not self.low <= self.p50 <= self.high:
            raise ValueError(f"need low <= p50 <= high, got {self.low}, {self.p50}, {self.high}")

    def sample(self, rng: random.Random) -> float:
        sigma = math.log(self.p90 / self.p50) / _Z90
        return min(self.high, max(self.low, self.p50 * math.exp(rng.gauss(0.0, sigma))))


@dataclass(frozen=True, slots=True)
class SwarmShape:
    """What a swarm looks like, in REAL units measured on the traces (Claude Code unless marked
    SWE: mini-swe-agent), and the factors that scale it down to a 2-core CPU.

    Tokens are divided by `token_scale` and seconds by `time_scale`. Calls are merged, not
    dropped: one replayed sub-agent call stands for `sub_call_scale` real ones (its context grows
    by, and its tool wait lasts, the sum of that many real draws), so a sub-agent keeps its real
    lifetime and its context reaches its real (scaled) size in fewer calls. One replayed leader
    call stands for `leader_call_scale` real ones in context growth only: the swarm shows a window
    of a long leader session (around its sub-agent waves) whose context is as large as a real one
    but whose wall time is not stretched."""

    token_scale: float = 64.0
    time_scale: float = 8.0
    sub_call_scale: float = 2.0
    leader_call_scale: float = 6.0
    num_tasks: int = 10  # tasks running at once
    min_subagents: int = 3  # per task (Claude Code: 1-12 per session that has any, p50 2)
    max_subagents: int = 5
    two_waves_prob: float = 0.5  # a task with >= 4 sub-agents starts them in two waves
    system_tokens: int = 2900  # system prompt, p50
    num_tools: int = 2  # a task tool and one other: their total size is what matters to the cache
    tool_tokens: int = 12400  # all tool schemas together, p50 (our rendering's preamble included)
    task_tokens: Dist = Dist(500, 1500, 200, 4000)  # the user's task: first prompt minus the prefix
    leader_phase_calls: tuple[int, int] = (2, 3)  # replayed leader calls before/between/after waves
    leader_growth: Dist = Dist(682, 3371, 190, 16000)  # context growth a call: p10 193, p99 16.6K
    leader_output: Dist = Dist(221, 864, 107, 1536)  # completion tokens: p10 107
    leader_tool_s: Dist = Dist(10.0, 50.0, 0.5, 60.0)  # think+tool p50 10 s (p90 160 s has humans;
    #                                                     capped at SWE's 60 s tool time-out)
    sub_calls: Dist = Dist(11, 17.5, 5, 24)  # calls a sub-agent: p10 5, p90 17.5, p99 23
    sub_growth: Dist = Dist(2395, 10706, 470, 30000)  # p10 470 (file reads, search hits)
    sub_output: Dist = Dist(232, 412, 125, 1500)  # p10 125
    sub_tool_s: Dist = Dist(3.0, 29.0, 0.5, 80.0)  # p50 3 s, p99 73 s; lifetime p50 120 s
    instruction_tokens: Dist = Dist(400, 1000, 100, 3000)  # task tool prompt: siblings differ ~200-600
    summary_tokens: Dist = Dist(1000, 2500, 200, 4000)  # a sub-agent's final answer to its leader
    task_stagger_s: float = 20.0  # tasks start within this window
    spawn_stagger_s: float = 2.0  # sub-agents of one wave start within this window
    long_wait_s: float = 20.0  # a tool wait this long suspends the agent (offload, then prefetch)

    def __post_init__(self) -> None:
        if min(self.token_scale, self.time_scale) <= 0:
            raise ValueError("token_scale and time_scale must be > 0")
        if min(self.sub_call_scale, self.leader_call_scale) < 1:
            raise ValueError("call scales must be >= 1 (one replayed call stands for that many real ones)")
        if self.num_tasks < 1:
            raise ValueError("num_tasks must be >= 1")
        if not 1 <= self.min_subagents <= self.max_subagents:
            raise ValueError("need 1 <= min_subagents <= max_subagents")
        if not 1 <= self.leader_phase_calls[0] <= self.leader_phase_calls[1]:
            raise ValueError("leader_phase_calls must be an increasing pair of positive counts")
        if self.num_tools < 2:
            raise ValueError("need the task tool and at least one other")

    def quick(self) -> SwarmShape:
        """The `--quick` swarm: the same tasks and distributions with less in them: three
        sub-agents a task (one wave), fewer leader calls, sub-agent calls merged by three."""
        return replace(self, min_subagents=3, max_subagents=3, leader_phase_calls=(1, 2), sub_call_scale=3.0)

    def tokens(self, dist: Dist, rng: random.Random, least: int = 4, calls: float = 1.0) -> int:
        """A scaled token count: the sum of `calls` real draws from `dist`."""
        return max(least, round(_sum_of(dist, rng, calls) / self.token_scale))

    def seconds(self, dist: Dist, rng: random.Random, calls: float = 1.0) -> float:
        """A scaled duration: the sum of `calls` real draws from `dist`."""
        return _sum_of(dist, rng, calls) / self.time_scale

    def sub_call_count(self, rng: random.Random) -> int:
        return max(2, round(self.sub_calls.sample(rng) / self.sub_call_scale))

    def tool_schema_tokens(self) -> int:
        """Scaled tokens of one tool schema, the template's tools preamble taken off the total."""
        return max(0, round((self.tool_tokens / self.token_scale - TOOLS_PREAMBLE_TOKENS) / self.num_tools))

    @property
    def long_wait(self) -> float:
        return self.long_wait_s / self.time_scale


@dataclass(frozen=True, slots=True)
class Call:
    """One model call of an agent."""

    messages: tuple[dict, ...]  # the whole chat window sent (the tools are the swarm's)
    max_tokens: int  # completion length (sent with ignore_eos, so exact)
    tool_wait_s: float  # tool time after this call returns, before the next; 0 after the last
    suspend: bool = False  # suspended after this call: offload now, prefetch before the next call
    spawns: tuple[str, ...] = ()  # sub-agents the leader starts after this call and waits for


@dataclass(frozen=True, slots=True)
class Agent:
    session_id: str
    parent_session_id: str  # a leader (root) names itself
    calls: tuple[Call, ...]
    start_delay_s: float = 0.0  # after the swarm starts (leader) or after its spawn (sub-agent)
    fork_messages: int = 0  # leading messages taken from the leader's window (sub-agents)
    final_answer: str = ""  # what a sub-agent's last completion hands back to its leader

    @property
    def is_root(self) -> bool:
        return self.session_id == self.parent_session_id


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str
    leader: Agent
    subagents: tuple[Agent, ...]

    def agents(self) -> tuple[Agent, ...]:
        return (self.leader, *self.subagents)

    def agent(self, session_id: str) -> Agent:
        for a in self.agents():
            if a.session_id == session_id:
                return a
        raise KeyError(session_id)


@dataclass(frozen=True, slots=True)
class Swarm:
    seed: int
    shape: SwarmShape
    system_prompt: str
    tools: tuple[dict, ...]
    tasks: tuple[Task, ...]

    def agents(self) -> list[Agent]:
        return [a for t in self.tasks for a in t.agents()]

    @property
    def num_calls(self) -> int:
        return sum(len(a.calls) for a in self.agents())


def generate_swarm(seed: int = 0, shape: SwarmShape | None = None) -> Swarm:
    """The swarm for `seed`: equal seeds and shapes give equal swarms."""
    shape = shape or SwarmShape()
    rng = random.Random(seed)
    opening = f"You are a software engineering agent (swarm {seed}). "  # about 12 tokens
    system_prompt = opening + words(rng, max(4, round(shape.system_tokens / shape.token_scale) - 12))
    per_tool = shape.tool_schema_tokens()
    names = [TASK_TOOL] + [f"tool_{k}_{w}" for k, w in enumerate(words(rng, shape.num_tools - 1).split())]
    tools = tuple(tool_schema(rng, name, per_tool) for name in names)
    tasks = tuple(_task(rng, shape, f"task-{i:02d}", system_prompt, tools) for i in range(shape.num_tasks))
    return Swarm(seed=seed, shape=shape, system_prompt=system_prompt, tools=tools, tasks=tasks)


class _Window:
    """An agent's growing chat window, and the ids of its tool calls."""

    def __init__(self, session_id: str, messages: list[dict]) -> None:
        self.session_id = session_id
        self.messages = messages
        self._num_calls = 0

    def call_id(self) -> str:
        self._num_calls += 1
        return f"call_{self.session_id}_{self._num_calls}"

    def tool_exchange(self, rng: random.Random, tools: tuple[dict, ...], output: int, growth: int) -> None:
        """Append an assistant turn calling one tool (about `output` tokens) and that tool's result."""
        call_id = self.call_id()
        tool = rng.choice(tools[1:])  # any tool but the task tool
        self.messages.append({"role": "assistant", "content": words(rng, max(1, output // 2)),
                              "tool_calls": [tool_call(rng, call_id, tool, max(2, output - output // 2))]})
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": words(rng, max(4, growth - output))})


def _task(rng: random.Random, shape: SwarmShape, task_id: str, system_prompt: str, tools: tuple[dict, ...]) -> Task:
    leader_id = task_id
    window = _Window(leader_id, [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": f"Task {task_id}: " + words(rng, shape.tokens(shape.task_tokens, rng))},
    ])
    num_subs = rng.randint(shape.min_subagents, shape.max_subagents)
    waves = [num_subs]
    if num_subs >= 4 and rng.random() < shape.two_waves_prob:
        first = rng.randint(2, num_subs - 2)
        waves = [first, num_subs - first]
    calls: list[Call] = []
    subagents: list[Agent] = []
    boundaries = [len(window.messages)]  # where a sub-agent may fork the leader's window
    for wave in waves:
        for _ in range(rng.randint(*shape.leader_phase_calls)):
            calls.append(_leader_tool_call(rng, shape, window, tools))
            boundaries.append(len(window.messages))
        fork = rng.choice(boundaries)
        spawn_msgs = tuple(window.messages)
        ids = [sub_agent_id(leader_id, str(len(subagents) + k)) for k in range(wave)]
        instructions = [words(rng, shape.tokens(shape.instruction_tokens, rng)) for _ in ids]
        wave_agents = [_subagent(rng, shape, sid, leader_id, window.messages[:fork], text, tools)
                       for sid, text in zip(ids, instructions)]
        subagents.extend(wave_agents)
        calls.append(Call(spawn_msgs, shape.tokens(shape.leader_output, rng), 0.0, suspend=True, spawns=tuple(ids)))
        call_ids = [window.call_id() for _ in ids]
        window.messages.append({"role": "assistant", "content": words(rng, 6), "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": TASK_TOOL, "arguments": json.dumps({"prompt": text})}}
            for cid, text in zip(call_ids, instructions)]})
        for cid, agent in zip(call_ids, wave_agents):
            window.messages.append({"role": "tool", "tool_call_id": cid, "content": agent.final_answer})
        boundaries.append(len(window.messages))
    for _ in range(rng.randint(*shape.leader_phase_calls)):
        calls.append(_leader_tool_call(rng, shape, window, tools))
    calls.append(Call(tuple(window.messages), shape.tokens(shape.leader_output, rng), 0.0))  # the final answer
    leader = Agent(leader_id, leader_id, tuple(calls),
                   start_delay_s=rng.uniform(0.0, shape.task_stagger_s / shape.time_scale))
    return Task(task_id, leader, tuple(subagents))


def _leader_tool_call(rng: random.Random, shape: SwarmShape, window: _Window, tools: tuple[dict, ...]) -> Call:
    output = shape.tokens(shape.leader_output, rng)
    growth = max(shape.tokens(shape.leader_growth, rng, calls=shape.leader_call_scale), output + 4)
    wait = shape.seconds(shape.leader_tool_s, rng)
    call = Call(tuple(window.messages), output, wait, suspend=wait >= shape.long_wait)
    window.tool_exchange(rng, tools, output, growth)
    return call


def _subagent(rng: random.Random, shape: SwarmShape, session_id: str, leader_id: str, fork: list[dict],
              instruction: str, tools: tuple[dict, ...]) -> Agent:
    window = _Window(session_id, [*fork, {"role": "user", "content": instruction}])
    num_calls = shape.sub_call_count(rng)
    calls = []
    for _ in range(num_calls - 1):
        output = shape.tokens(shape.sub_output, rng)
        growth = max(shape.tokens(shape.sub_growth, rng, calls=shape.sub_call_scale), output + 4)
        wait = shape.seconds(shape.sub_tool_s, rng, calls=shape.sub_call_scale)
        calls.append(Call(tuple(window.messages), output, wait, suspend=wait >= shape.long_wait))
        window.tool_exchange(rng, tools, output, growth)
    answer = words(rng, shape.tokens(shape.summary_tokens, rng))
    calls.append(Call(tuple(window.messages), max(4, len(answer.split())), 0.0))
    return Agent(session_id, leader_id, tuple(calls), start_delay_s=rng.uniform(0.0, shape.spawn_stagger_s / shape.time_scale),
                 fork_messages=len(fork), final_answer=answer)
