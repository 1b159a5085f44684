"""The live driver: agent programs against an OpenAI-compatible server, in (scaled) real time.

    result = asyncio.run(replay_live(workload, "http://127.0.0.1:8000", "dummy:tiny",
                                     HintPlan(hints=True), time_scale=8.0))

Each program (`hintkv.workload.agent`) runs as an asyncio task; trace seconds are divided by
`time_scale`. A `Send` is one streamed `/v1/completions` request with the call's token ids as
the prompt, `max_tokens` + `ignore_eos` (the recorded output length), `temperature` 0 and
`stream_options.include_usage` (`prompt_tokens`, `prompt_tokens_details.cached_tokens`); with
hints on it carries `agent_hint` {session_id, parent_session_id}. A `Manage` is a management
request (`manage_request: true`, a session edit) on the same endpoint. A range evict of a
compressed context is a `tokens` edit (our extension of the protocol for token-id prompts:
docs/protocol.md): positions [stale_from, old window end) of the session's previous prompt and
output; it is awaited before the call it precedes (the call re-uses the kept prefix, so the
server must drop the stale tail first). Management requests are best-effort (failures are
recorded).

TTFT runs from when the agent was ready to call: a prefetch sent just before a call counts
against the hinted run, as it would for a real agent. Works with any OpenAI-compatible server
(`--peer`): without hints nothing but standard fields (and `ignore_eos`) is sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from hintkv.workload.agent import (
    HintPlan,
    Manage,
    Program,
    Run,
    Send,
    Sleep,
    workload_programs,
)
from hintkv.workload.program import Workload
from hintkv.workload.records import CallRecord


@dataclass(slots=True)
class LiveResult:
    hints: bool
    wall_s: float = 0.0
    calls: list[CallRecord] = field(default_factory=list)
    actions: dict[str, list[int]] = field(default_factory=dict)  # action -> [sent, ok]
    range_edits: list[tuple[float, str, dict | None]] = field(default_factory=list)  # (t done, session,
    #                                                        the server's `agent_hint_result` edit)
    task_s: dict[str, float] = field(default_factory=dict)  # task -> end-to-end seconds
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, session) in order

    @property
    def prompt_tokens(self) -> int:
        """Every call's, an errored one's too (the count it sent): an errored call is a miss."""
        return sum(c.prompt_tokens or 0 for c in self.calls)

    @property
    def cached_tokens(self) -> int:
        return sum(c.cached_tokens or 0 for c in self.calls if c.ok)

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def num_errors(self) -> int:
        return sum(1 for c in self.calls if not c.ok)


async def replay_live(workload: Workload, base_url: str, model: str, plan: HintPlan, *, time_scale: float = 1.0,
                      api_key: str = "EMPTY", timeout_s: float = 600.0,
                      on_call: Callable[[CallRecord], None] | None = None,
                      transport: httpx.AsyncBaseTransport | None = None) -> LiveResult:
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
    headers = {"authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), limits=limits, timeout=timeout_s,
                                 headers=headers, transport=transport) as http:
        driver = _LiveDriver(http, model, plan, time_scale, on_call)
        await driver.execute(workload_programs(workload, plan))
        await asyncio.gather(*driver._pending.values())
        driver.result.wall_s = driver.clock()
        return driver.result


class _LiveDriver:
    def __init__(self, http: httpx.AsyncClient, model: str, plan: HintPlan, time_scale: float,
                 on_call: Callable[[CallRecord], None] | None) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.http = http
        self.model = model
        self.time_scale = time_scale
        self.on_call = on_call
        self.result = LiveResult(hints=plan.hints)
        self._t0 = time.perf_counter()
        self._ready: dict[str, float] = {}  # session -> when its prefetch was sent
        self._task_start: dict[str, float] = {}
        self._pending: dict[str, asyncio.Task] = {}  # session -> its management request in flight
        self._window: dict[str, int] = {}  # session -> tokens of its last call (prompt + output)

    def clock(self) -> float:
        return time.perf_counter() - self._t0

    async def drive(self, program: Program) -> None:
        value: Any = None
        while True:
            try:
                effect = program.send(value)
            except StopIteration:
                return
            value = await self.execute(effect)

    async def execute(self, effect: Any) -> Any:
        if isinstance(effect, Sleep):
            await asyncio.sleep(effect.seconds / self.time_scale)
        elif isinstance(effect, Run):
            await asyncio.gather(asyncio.sleep(effect.at_least_s / self.time_scale),
                                 *(self._child(d, p) for d, p in effect.children))
        elif isinstance(effect, Send):
            return await self.send(effect)
        elif isinstance(effect, Manage):
            return await self.manage(effect)
        else:
            raise TypeError(f"unknown effect {effect!r}")
        return None

    async def _child(self, delay_s: float, program: Program) -> None:
        await asyncio.sleep(delay_s / self.time_scale)
        await self.drive(program)

    def _hint(self, session) -> dict[str, Any]:
        return {"session_id": session.session_id, "parent_session_id": session.parent_session_id}

    async def send(self, s: Send) -> CallRecord:
        now = self.clock()
        self._task_start.setdefault(s.task_id, now)
        start = self._ready.pop(s.session.session_id, now)
        rec = CallRecord(s.task_id, s.session.session_id, s.index, start, prompt_tokens=s.call.num_prompt_tokens)
        self._window[s.session.session_id] = s.call.num_prompt_tokens + s.call.max_tokens
        self.result.events.append((now, "send", s.session.session_id))
        body: dict[str, Any] = {"model": self.model, "prompt": s.call.prompt_ids(), "max_tokens": s.call.max_tokens,
                                "ignore_eos": True, "temperature": 0.0, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.result.hints:
            body["agent_hint"] = self._hint(s.session)
        t0 = self._t0 + start
        # the agent ready -> the request about to be built: its JSON, httpx's build and a pooled
        # connection come after (in the breakdown's other_s)
        send_s = time.perf_counter() - t0
        try:
            async with self.http.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if rec.ttft_s is None and chunk.get("choices"):
                        rec.ttft_s = time.perf_counter() - t0
                    usage = chunk.get("usage")
                    if usage:
                        rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
                        rec.completion_tokens = usage.get("completion_tokens")
                        rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                    if chunk.get("hintkv_metrics"):
                        rec.ttft_parts = _parts(chunk["hintkv_metrics"], send_s)
            rec.e2e_s = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - a failed call (any cause) is data, not the end of the replay
            rec.error = f"{type(exc).__name__}: {exc}"[:300]
        self.result.calls.append(rec)
        self.result.task_s[s.task_id] = self.clock() - self._task_start[s.task_id]
        if self.on_call is not None:
            self.on_call(rec)
        return rec

    async def manage(self, m: Manage) -> bool:
        now = self.clock()
        sid = m.session.session_id
        kind = m.action if m.token_start is None else f"{m.action}-range"
        self.result.events.append((now, kind, sid))
        if m.action == "prefetch" or m.token_start is not None:
            self._ready.setdefault(sid, now)  # the agent is ready to call: this counts in its TTFT
        counts = self.result.actions.setdefault(kind, [0, 0])
        counts[0] += 1
        edit: dict[str, Any] = {"type": m.action, "target": "session"}
        if m.token_start is not None:
            end = max(self._window.get(sid, 0), m.token_start + 1)
            edit = {"type": m.action, "target": "tokens", "start": m.token_start, "end": end}
        hint = {**self._hint(m.session), "context_management": {"manage_request": True, "edits": [edit]}}
        before = self._pending.pop(sid, None)
        task = asyncio.create_task(self._post_manage(before, hint, counts, kind))
        if m.action == "evict":
            # the session is over, or its next call re-uses the kept prefix: the stale tail must be
            # gone before that call arrives
            return await task
        self._pending[sid] = task  # offload rides along with the tool wait; prefetch with the call
        return True

    async def _post_manage(self, before: asyncio.Task | None, hint: dict[str, Any], counts: list[int],
                           kind: str) -> bool:
        """One management request, after the session's previous one (actions stay in order)."""
        if before is not None:
            await before
        result = None
        try:
            resp = await self.http.post("/v1/completions", json={"model": self.model, "agent_hint": hint})
            ok = resp.status_code == 200
            if ok and kind.endswith("-range"):
                result = (resp.json().get("agent_hint_result") or {}).get("edits", [None])[0]
        except (httpx.HTTPError, ValueError):
            ok = False
        counts[1] += int(ok)
        if kind.endswith("-range"):
            self.result.range_edits.append((self.clock(), hint["session_id"], result))
        return ok


def _parts(metrics: dict[str, Any], send_s: float) -> dict[str, float] | None:
    """A call's TTFT parts: the engine's, the server's around them (a hintkv server's
    `serve_parts`, their sum `serve_s` left out) and the replay's own `client_send_s`."""
    engine = metrics.get("ttft_parts")
    if not engine:
        return None
    serve = {k: v for k, v in (metrics.get("serve_parts") or {}).items() if k != "serve_s"}
    return {**engine, **serve, "client_send_s": send_s}
