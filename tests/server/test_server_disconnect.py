"""A client that goes away mid-request must abort it: the engine frees its KV blocks.

Raw sockets let the test close the connection at a moment it chooses (after the first chunk
of a stream, or while a non-streamed request is running). Each test also checks that fewer
tokens were generated than asked for, which only an abort can explain. A turn that ends its
session (`session_control: stop`) ends it even when its client leaves mid-generation.
"""

from __future__ import annotations

import json
import re
import socket

import anyio
import httpx
import pytest
from server_testing import API_KEY, LiveServer, wait_until

from hintkv.protocol.result import AgentHintResult
from hintkv.server.hints import RequestHint, chat_hint
from hintkv.server.serving import AfterGeneration

MAX_TOKENS = 400


def _generated_tokens(live_server: LiveServer) -> float:
    text = httpx.get(live_server.base_url + "/metrics", headers=live_server.headers).text
    return float(re.search(r"^hintkv_generation_tokens_total (\S+)$", text, re.M).group(1))


def _open_request(live_server: LiveServer, stream: bool, **extra) -> socket.socket:
    body = json.dumps(
        {
            "prompt": "Go on forever:",
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": stream,
            "ignore_eos": True,
            **extra,
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", live_server.port), timeout=60)
    sock.sendall(head + body)
    return sock


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_disconnect_aborts_and_frees_kv(live_server, stream):
    engine = live_server.engine
    assert wait_until(lambda: engine.stats().kv_blocks_in_use == 0)
    before = _generated_tokens(live_server)
    sock = _open_request(live_server, stream)
    try:
        if stream:
            received = b""
            while b"data: {" not in received:  # the first token has been streamed to us
                received += sock.recv(4096)
        assert wait_until(lambda: engine.stats().kv_blocks_in_use > 0)
        assert wait_until(lambda: _generated_tokens(live_server) > before)
    finally:
        sock.close()
    assert wait_until(lambda: engine.stats().kv_blocks_in_use == 0)
    assert engine.stats().num_running == 0 and engine.stats().num_waiting == 0
    assert _generated_tokens(live_server) - before < MAX_TOKENS


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_a_stop_turn_whose_client_left_still_ends_the_session(live_server, stream):
    """review rev26 A11: the edits ran only with the final response, so the session stayed `waiting`,
    its KV held and ranked as live, until --session-idle-expiry."""
    sid = f"stop-turn-left-{stream}"
    hint = {"session_id": sid, "parent_session_id": sid}
    first = httpx.post(live_server.v1 + "/completions", headers=live_server.headers, timeout=60,
                       json={"prompt": "First turn of the agent " * 4, "max_tokens": 4, "agent_hint": hint})
    assert first.status_code == 200
    engine = live_server.engine
    sock = _open_request(live_server, stream, agent_hint={**hint, "session_control": {"type": "stop"}})
    try:
        assert wait_until(lambda: engine.stats().num_running > 0)
    finally:
        sock.close()
    assert wait_until(lambda: engine.stats().num_running == 0 and engine.stats().num_waiting == 0)

    def session() -> dict:
        return httpx.get(f"{live_server.v1}/sessions/{sid}", headers=live_server.headers, timeout=30).json()

    assert wait_until(lambda: session()["state"] == "ended"), session()
    assert session()["held_tokens"] == 0


def test_a_departed_turns_range_evict_planned_in_after_is_carried_out():
    """review rev27 B3: a client that left while `after()` was still planning its edits (a long window's
    render in a worker thread) cancelled the apply, and `client_gone` then saw the turn done: a
    `manage_request: false` messages evict was lost, the stale context held and ranked as live. The
    apply here waits on an event at the point the render would be, so the cancel lands there every time."""
    messages = [{"role": "user", "content": str(i)} for i in range(4)]
    raw = {"messages": messages, "agent_hint": {"session_id": "s", "parent_session_id": "s", "context_management": {
        "manage_request": False, "edits": [{"type": "evict", "target": "messages", "start": 1, "end": 3}]}}}
    hinted = chat_hint(raw, {}, messages, None, "t")
    planning, release = anyio.Event(), anyio.Event()
    applied: list[list] = []

    async def apply(rh: RequestHint) -> AgentHintResult:
        planning.set()
        await release.wait()  # the render
        applied.append(rh.edits)
        return AgentHintResult(session_id="s", parent_session_id="s", manage_request=False)

    async def turn() -> None:
        edits = AfterGeneration(hinted, apply)
        async with anyio.create_task_group() as stream:  # the response's task, cancelled as the client leaves
            stream.start_soon(edits.after)
            await planning.wait()
            stream.cancel_scope.cancel()
            release.set()
        await edits.client_gone()  # TicketedStream's finally: the stream did not complete

    anyio.run(turn)
    assert applied == [hinted.edits]
