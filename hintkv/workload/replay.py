"""Replay a `Swarm` against an OpenAI-compatible server at (scaled) real time.

    result = asyncio.run(replay_swarm(swarm, "http://127.0.0.1:8000", "dummy:tiny", hints=True))
    result.hit_rate, [c.ttft_s for c in result.calls]

Every agent is a coroutine; all tasks start together (each leader after its start delay). A call
is one streamed chat completion (greedy, `max_tokens` from the swarm, `ignore_eos` so outputs have
fixed length, `stream_options.include_usage` for `prompt_tokens` and
`prompt_tokens_details.cached_tokens`). After a call the agent sleeps its tool wait; a leader's
task-tool call instead starts its sub-agents and waits for them all.

hints=True sends what openJiuwen agent-core sends, through `hintkv.client.AsyncSessionClient`:
each request carries `agent_hint` {session_id, parent_session_id}; an agent suspended after a call
(a long tool wait, a leader waiting for its sub-agents) sends `offload`, and `prefetch` before
its next call; a sub-agent that ends sends `evict`; when a task ends its root's tree is evicted.
Management requests are best-effort: a failure is recorded and the replay goes on.
hints=False sends the same requests with no `agent_hint` and no management requests.

TTFT is measured from when the agent is ready to call, so a prefetch sent just before a call
counts against the hinted run, as it would for a real agent. A call that fails is recorded with
its error and the agent goes on with its next call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from hintkv.client.identity import Session
from hintkv.client.lifecycle import ActionResult, AsyncSessionClient
from hintkv.workload.records import CallRecord
from hintkv.workload.swarm import Agent, Call, Swarm, Task

__all__ = ["CallRecord", "ReplayResult", "replay_swarm"]


@dataclass(slots=True)
class ReplayResult:
    hints: bool
    wall_s: float
    calls: list[CallRecord] = field(default_factory=list)
    actions: list[ActionResult] = field(default_factory=list)  # management requests (hints only)

    @property
    def ok_calls(self) -> list[CallRecord]:
        return [c for c in self.calls if c.ok]

    @property
    def num_errors(self) -> int:
        return sum(1 for c in self.calls if not c.ok)

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens or 0 for c in self.calls)

    @property
    def cached_tokens(self) -> int:
        return sum(c.cached_tokens or 0 for c in self.calls)

    @property
    def hit_rate(self) -> float | None:
        """Prefix-cache hit rate: cached over prompt tokens, summed over all calls."""
        total = self.prompt_tokens
        return self.cached_tokens / total if total else None


async def replay_swarm(
    swarm: Swarm,
    base_url: str,
    model: str,
    *,
    hints: bool,
    api_key: str = "EMPTY",
    timeout_s: float = 600.0,
    on_call: Callable[[CallRecord], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ReplayResult:
    """Run every task of `swarm` at once against `base_url`; returns all calls' records.

    `transport` replaces the network (tests hand in an `httpx.MockTransport`)."""
    import openai  # imported here: `hintkv --help` should not pay for it

    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s, transport=transport) as http:
        client = openai.AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key, max_retries=0,
                                    timeout=timeout_s, http_client=http)
        run = _Replay(swarm, client, model, hints, on_call)
        await asyncio.gather(*(run.task(t) for t in swarm.tasks))
        return ReplayResult(hints=hints, wall_s=time.perf_counter() - run.t0, calls=run.calls, actions=run.actions)


class _Replay:
    """The state one replay shares between its agents' coroutines."""

    def __init__(self, swarm: Swarm, client, model: str, hints: bool,
                 on_call: Callable[[CallRecord], None] | None) -> None:
        self.client = client
        self.model = model
        self.tools = list(swarm.tools)
        self.sessions = AsyncSessionClient(client, model) if hints else None
        self.on_call = on_call
        self.calls: list[CallRecord] = []
        self.actions: list[ActionResult] = []
        self.t0 = time.perf_counter()

    async def task(self, task: Task) -> None:
        leader = task.leader
        await asyncio.sleep(leader.start_delay_s)
        await self.agent(task, leader)
        if self.sessions is not None:
            await self.action(self.sessions.release_tree(leader.session_id))

    async def agent(self, task: Task, agent: Agent) -> None:
        session = Session(agent.session_id, None if agent.is_root else agent.parent_session_id)
        for k, call in enumerate(agent.calls):
            await self.call(task, session, k, call)
            # the tool (or the sub-agents) starts as soon as the call returns; an offload rides along
            waits = [self.subagent(task, task.agent(sid)) for sid in call.spawns] or [asyncio.sleep(call.tool_wait_s)]
            if call.suspend and self.sessions is not None:
                waits.append(self.action(self.sessions.suspend(session)))
            await asyncio.gather(*waits)
        if self.sessions is not None and not agent.is_root:
            await self.action(self.sessions.release(session))

    async def action(self, sent: Awaitable[ActionResult]) -> None:
        self.actions.append(await sent)

    async def subagent(self, task: Task, agent: Agent) -> None:
        await asyncio.sleep(agent.start_delay_s)
        await self.agent(task, agent)

    async def call(self, task: Task, session: Session, index: int, call: Call) -> None:
        start = time.perf_counter()
        rec = CallRecord(task.task_id, session.session_id, index, start - self.t0)
        try:
            await self._stream(session, call, start, rec)
        except Exception as exc:  # noqa: BLE001 - a failed call (any cause) is data, not the end of the replay
            rec.error = f"{type(exc).__name__}: {exc}"[:300]
        self.calls.append(rec)
        if self.on_call is not None:
            self.on_call(rec)

    async def _stream(self, session: Session, call: Call, start: float, rec: CallRecord) -> None:
        kwargs = {"messages": list(call.messages), "tools": self.tools, "stream": True,
                  "stream_options": {"include_usage": True}, "max_tokens": call.max_tokens, "temperature": 0.0,
                  "extra_body": {"ignore_eos": True}}
        if self.sessions is not None:
            if self.sessions.is_offloaded(session):
                await self.action(self.sessions.prepare(session))
            stream = await self.sessions.chat(session, **kwargs)
        else:
            stream = await self.client.chat.completions.create(model=self.model, **kwargs)
        async for chunk in stream:
            if rec.ttft_s is None and any(c.delta and c.delta.content for c in chunk.choices):
                rec.ttft_s = time.perf_counter() - start
            if chunk.usage is not None:
                rec.prompt_tokens = chunk.usage.prompt_tokens
                rec.completion_tokens = chunk.usage.completion_tokens
                details = chunk.usage.prompt_tokens_details
                rec.cached_tokens = (details.cached_tokens or 0) if details is not None else 0
        rec.e2e_s = time.perf_counter() - start
