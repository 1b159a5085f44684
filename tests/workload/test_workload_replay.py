"""The replay driver, seen from the wire: what it sends with hints on and off, and in what order.

The server is an `httpx.MockTransport` speaking the OpenAI wire format (streamed chat chunks with
usage, management envelopes), so the real driver, the real openai SDK and the real
`AsyncSessionClient` run end to end with no server and no sleeps worth mentioning (time / 1000).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from hintkv.workload.replay import replay_swarm
from hintkv.workload.swarm import SwarmShape, generate_swarm

CACHED = 32  # what the stand-in server says was cached, for every call


class WireLog:
    """An OpenAI-shaped stand-in server that records every request body in arrival order."""

    def __init__(self, fail_management: bool = False) -> None:
        self.bodies: list[dict] = []
        self.fail_management = fail_management

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        management = (body.get("agent_hint") or {}).get("context_management")
        if management:
            if self.fail_management:
                return httpx.Response(503, json={"error": {"message": "busy"}})
            return httpx.Response(200, json=_envelope(body))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_sse(body))

    def inference(self) -> list[dict]:
        return [b for b in self.bodies if not (b.get("agent_hint") or {}).get("context_management")]

    def by_session(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for b in self.bodies:
            out.setdefault(b["agent_hint"]["session_id"], []).append(b)
        return out


def _envelope(body: dict) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


def _sse(body: dict) -> bytes:
    prompt = 100 + len(body["messages"])
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    events += [{**base, "choices": [{"index": 0, "delta": {"content": "w "}}]} for _ in range(body["max_tokens"])]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    events.append({**base, "choices": [], "usage": {
        "prompt_tokens": prompt, "completion_tokens": body["max_tokens"], "total_tokens": prompt + body["max_tokens"],
        "prompt_tokens_details": {"cached_tokens": CACHED}}})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"


def _kind(body: dict) -> str:
    management = (body.get("agent_hint") or {}).get("context_management")
    return management["edits"][0]["type"] if management else "chat"


@pytest.fixture(scope="module")
def swarm():
    return generate_swarm(seed=5, shape=SwarmShape(num_tasks=3, time_scale=1000.0).quick())


def _replay(swarm, hints: bool, wire: WireLog):
    return asyncio.run(replay_swarm(swarm, "http://swarm.test", "m", hints=hints, transport=httpx.MockTransport(wire)))


def test_hints_off_sends_plain_requests(swarm):
    wire = WireLog()
    result = _replay(swarm, False, wire)
    assert len(wire.bodies) == swarm.num_calls == len(result.calls)
    assert all("agent_hint" not in b for b in wire.bodies)
    for body in wire.bodies:
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True and body["temperature"] == 0.0
        assert body["tools"] == list(swarm.tools)
    assert result.num_errors == 0 and result.actions == []
    assert result.cached_tokens == CACHED * swarm.num_calls
    assert result.hit_rate == pytest.approx(result.cached_tokens / result.prompt_tokens)
    assert all(c.ttft_s is not None and c.e2e_s >= c.ttft_s for c in result.calls)


def test_hints_on_identity_and_lifecycle(swarm):
    wire = WireLog()
    result = _replay(swarm, True, wire)
    assert len(wire.inference()) == swarm.num_calls
    sessions = wire.by_session()
    for agent in swarm.agents():
        sent = sessions[agent.session_id]
        for body in sent:
            assert body["agent_hint"]["parent_session_id"] == agent.parent_session_id
        kinds = [_kind(b) for b in sent]
        assert kinds.count("chat") == len(agent.calls)
        assert kinds[-1] == "evict"  # every session ends with an evict (a leader's is its tree's)
        last = sent[-1]
        assert last["messages"] == [] and last["agent_hint"]["context_management"] == {
            "manage_request": True, "edits": [{"type": "evict", "target": "session"}]}
        # every offload is followed by a prefetch before that session's next call
        for i, kind in enumerate(kinds):
            if kind == "offload" and "chat" in kinds[i:]:
                assert kinds[i + 1] == "prefetch" and kinds[i + 2] == "chat"
        suspended = sum(c.suspend for c in agent.calls)
        assert kinds.count("offload") == suspended
    assert all(a.ok for a in result.actions)
    assert result.num_errors == 0


def test_leader_resumes_after_its_subagents_end(swarm):
    wire = WireLog()
    _replay(swarm, True, wire)
    order = [(b["agent_hint"]["session_id"], _kind(b)) for b in wire.bodies]
    for task in swarm.tasks:
        lead_chats = [i for i, (sid, k) in enumerate(order) if sid == task.leader.session_id and k == "chat"]
        for n, call in enumerate(task.leader.calls):
            for sid in call.spawns:
                sub_msgs = [i for i, (s, _) in enumerate(order) if s == sid]
                assert lead_chats[n] < sub_msgs[0] and sub_msgs[-1] < lead_chats[n + 1]


def test_failed_management_never_stops_the_replay(swarm):
    wire = WireLog(fail_management=True)
    result = _replay(swarm, True, wire)
    assert len(wire.inference()) == swarm.num_calls
    assert result.num_errors == 0
    assert result.actions and not any(a.ok for a in result.actions)
