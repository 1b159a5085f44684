"""SessionClient / AsyncSessionClient over the real openai SDK, with the network faked by httpx.MockTransport.

What is checked is what leaves the SDK: the JSON body, the per-action timeout handed to httpx,
the number of attempts; and that a failing server never makes a lifecycle call raise.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from hintkv.client import AsyncSessionClient, Session, SessionClient, sub_agent
from hintkv.protocol import parse_agent_hint

ENVELOPE = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
}
REPORT = {"session_id": "main-0_sub_t1", "parent_session_id": "main-0", "manage_request": True, "edits": []}

WORKER = sub_agent("main-0", "t1")
OLD_MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
OLD_TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]


def _session_body(action: str, session_id: str = "main-0_sub_t1", parent: str = "main-0") -> dict:
    return {"model": "m", "messages": [], "stream": False, "agent_hint": {
        "session_id": session_id, "parent_session_id": parent,
        "context_management": {"manage_request": True, "edits": [{"type": action, "target": "session"}]}}}


class FakeServer:
    """Records what the SDK sends and answers with a fixed status (and the agent_hint_result field)."""

    def __init__(self, status: int = 200, error: Exception | None = None) -> None:
        self.status = status
        self.error = error
        self.bodies: list[dict] = []
        self.read_timeouts: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        self.read_timeouts.append(request.extensions["timeout"]["read"])
        if self.error is not None:
            raise self.error
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "nope", "type": "server_error"}})
        return httpx.Response(200, json={**ENVELOPE, "agent_hint_result": REPORT})


def _client(server: FakeServer) -> SessionClient:
    sdk = openai.OpenAI(base_url="http://hintkv.test/v1", api_key="k",
                        http_client=httpx.Client(transport=httpx.MockTransport(server)))
    return SessionClient(sdk, model="m")


def test_session_actions_send_exactly_the_protocol_bodies():
    server = FakeServer()
    sc = _client(server)
    results = [sc.prepare(WORKER), sc.suspend(WORKER), sc.release(WORKER), sc.release_tree("main-0")]
    assert server.bodies == [_session_body("prefetch"), _session_body("offload"), _session_body("evict"),
                             _session_body("evict", "main-0", "main-0")]
    assert server.read_timeouts == [2.0, 2.0, 3.0, 5.0]
    assert [(r.ok, r.action, r.target, r.sent) for r in results] == [
        (True, "prefetch", "session", True), (True, "offload", "session", True),
        (True, "evict", "session", True), (True, "evict", "session", True)]
    assert results[0].agent_hint_result == REPORT
    for body in server.bodies:  # and the server side accepts every one of them
        assert parse_agent_hint(body, {}, len(body["messages"]), 0).manage_request


def test_context_changed_sends_the_old_window_and_ranges_to_its_end():
    server = FakeServer()
    sc = _client(server)
    both = sc.context_changed(WORKER, OLD_MESSAGES, OLD_TOOLS, first_changed_message=2, first_changed_tool=1)
    tools_only = sc.context_changed(WORKER, OLD_MESSAGES, OLD_TOOLS, first_changed_tool=0)
    assert server.bodies[0] == {
        "model": "m", "messages": OLD_MESSAGES, "stream": False, "tools": OLD_TOOLS, "tool_choice": "auto",
        "agent_hint": {"session_id": "main-0_sub_t1", "parent_session_id": "main-0", "context_management": {
            "manage_request": True, "edits": [{"type": "evict", "target": "messages", "start": 2, "end": 4},
                                              {"type": "evict", "target": "tools", "start": 1, "end": 2}]}}}
    assert server.bodies[1]["agent_hint"]["context_management"]["edits"] == [
        {"type": "evict", "target": "tools", "start": 0, "end": 2}]
    assert server.read_timeouts == [1.5, 1.5]
    assert (both.ok, both.target, tools_only.target) == (True, "messages+tools", "tools")
    hint = parse_agent_hint(server.bodies[0], {}, len(OLD_MESSAGES), len(OLD_TOOLS))
    assert [(e.target, e.start, e.end) for e in hint.context_management.edits] == [("messages", 2, 4), ("tools", 1, 2)]


def test_context_changed_without_a_change_or_with_a_bad_index_sends_nothing():
    server = FakeServer()
    sc = _client(server)
    nothing = sc.context_changed(WORKER, OLD_MESSAGES, OLD_TOOLS)
    beyond = sc.context_changed(WORKER, OLD_MESSAGES, OLD_TOOLS, first_changed_message=4)
    assert server.bodies == []
    assert (nothing.ok, nothing.sent) == (True, False)
    assert (beyond.ok, beyond.sent) == (False, False) and "start < end" in beyond.error


def test_chat_carries_the_hint_and_merges_extra_body():
    server = FakeServer()
    sc = _client(server)
    reply = sc.chat(WORKER, OLD_MESSAGES, tools=OLD_TOOLS, max_tokens=8, extra_body={"cache_salt": "tenant-7"})
    assert reply.choices[0].finish_reason == "stop"
    assert server.bodies == [{"model": "m", "messages": OLD_MESSAGES, "tools": OLD_TOOLS, "max_tokens": 8,
                              "cache_salt": "tenant-7",
                              "agent_hint": {"session_id": "main-0_sub_t1", "parent_session_id": "main-0"}}]


def test_chat_prefetches_a_session_this_client_offloaded():
    server = FakeServer()
    sc = _client(server)
    sc.suspend(WORKER)
    assert sc.is_offloaded(WORKER)
    sc.chat(WORKER, [{"role": "user", "content": "go on"}])
    sc.chat(WORKER, [{"role": "user", "content": "again"}])
    kinds = [b["agent_hint"].get("context_management", {}).get("edits", [{"type": "infer"}])[0]["type"]
             for b in server.bodies]
    assert kinds == ["offload", "prefetch", "infer", "infer"]
    assert not sc.is_offloaded(WORKER)


@pytest.mark.parametrize("server", [
    FakeServer(status=500),
    FakeServer(status=400),
    FakeServer(error=httpx.ReadTimeout("slow")),
    FakeServer(error=httpx.ConnectError("refused")),
])
def test_failures_never_raise_and_are_tried_once(server, caplog):
    sc = _client(server)
    for action in (sc.prepare, sc.suspend, sc.release):
        result = action(WORKER)
        assert not result.ok and result.sent and result.error
    result = sc.context_changed(WORKER, OLD_MESSAGES, None, first_changed_message=1)
    assert not result.ok and result.error
    assert len(server.bodies) == 4  # one attempt each, even for a 500 the SDK would retry
    assert not sc.is_offloaded(WORKER)  # a failed offload is not recorded as offloaded
    assert "failed for session main-0_sub_t1" in caplog.text


def _async_client(handler) -> AsyncSessionClient:
    sdk = openai.AsyncOpenAI(base_url="http://hintkv.test/v1", api_key="k",
                             http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    return AsyncSessionClient(sdk, model="m")


def test_async_actions_of_one_session_are_sent_in_order():
    log: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        action = json.loads(request.content)["agent_hint"]["context_management"]["edits"][0]["type"]
        log.append(f"{action} start")
        if action == "offload":
            for _ in range(20):  # yield often: an evict sent concurrently would start in between
                await asyncio.sleep(0)
        log.append(f"{action} end")
        return httpx.Response(200, json=ENVELOPE)

    async def scenario():
        sc = _async_client(handler)
        other = Session("sub-2", "main-0")
        return await asyncio.gather(sc.suspend(WORKER), sc.release(WORKER), sc.prepare(other))

    results = asyncio.run(scenario())
    assert all(r.ok for r in results)
    assert log.index("offload end") < log.index("evict start")


def test_async_release_tree_waits_for_the_tree_and_failures_do_not_raise():
    log: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        hint = json.loads(request.content)["agent_hint"]
        log.append(f"{hint['session_id']} start")
        for _ in range(10):
            await asyncio.sleep(0)
        log.append(f"{hint['session_id']} end")
        if hint["session_id"] == "main-0":
            return httpx.Response(503, json={"error": {"message": "busy"}})
        return httpx.Response(200, json=ENVELOPE)

    async def scenario():
        sc = _async_client(handler)
        await sc.chat(WORKER, [{"role": "user", "content": "hi"}])
        return await asyncio.gather(sc.suspend(WORKER), sc.release_tree("main-0"))

    offloaded, tree = asyncio.run(scenario())
    assert offloaded.ok and not tree.ok and "503" in tree.error
    last_worker_end = max(i for i, entry in enumerate(log) if entry == "main-0_sub_t1 end")
    assert last_worker_end < log.index("main-0 start")
