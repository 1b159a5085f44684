"""A client that leaves through the router aborts the generation on the instance, streamed or not
(review rev26 A1: a non-streamed request ran to its end, the router waiting on the instance's reply
without watching its own client), and a stop turn whose client left still ends the session (review
rev26 A11). Raw sockets close the connection once the instance generates."""

from __future__ import annotations

import asyncio
import json
import re
import socket

import httpx
import pytest

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.router import build_router_app
from hintkv.router.app import Identity
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer
from tests.server.server_testing import wait_until

MAX_TOKENS = 900


@pytest.fixture(scope="module")
def routed():
    engine = AsyncLLM.from_config(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu",
                                               block_size=16, kv_cache_tokens=2048, max_model_len=1024,
                                               max_num_seqs=4))
    try:
        with BackgroundServer(build_app(engine, [])) as inst, \
                BackgroundServer(build_router_app([inst.base_url], health_interval_s=0.2)) as router:
            yield engine, inst, router
    finally:
        asyncio.run(engine.shutdown())


def _generated(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return float(re.search(r"^hintkv_generation_tokens_total (\S+)$", text, re.M).group(1))


def _leave_once_generating(engine, inst, router, body: dict) -> None:
    """Send `body` to the router on a raw socket and close it once the instance generates."""
    before = _generated(inst.base_url)
    raw = json.dumps({"prompt": "Go on forever:", "max_tokens": MAX_TOKENS, "temperature": 0,
                      "ignore_eos": True, **body}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", router.port), timeout=60)
    try:
        sock.sendall(head + raw)
        assert wait_until(lambda: _generated(inst.base_url) > before)
    finally:
        sock.close()
    assert wait_until(lambda: engine.stats().num_running == 0 and engine.stats().num_waiting == 0)
    assert engine.stats().kv_blocks_in_use == 0
    assert _generated(inst.base_url) - before < MAX_TOKENS, "the instance generated every token"
    assert wait_until(lambda: router.app.state.router.backends.backends[inst.base_url].inflight == 0)


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_a_client_gone_through_the_router_aborts_the_generation_on_the_instance(routed, stream):
    _leave_once_generating(*routed, {"stream": stream})


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_a_stop_turn_whose_client_left_through_the_router_ends_the_session(routed, stream):
    engine, inst, router = routed
    sid = f"routed-stop-left-{stream}"
    hint = {"session_id": sid, "parent_session_id": sid}
    first = httpx.post(router.base_url + "/v1/completions", timeout=60,
                       json={"prompt": "First turn of the agent " * 4, "max_tokens": 4, "agent_hint": hint})
    assert first.status_code == 200
    key = Identity({"agent_hint": hint}, {}).key
    assert router.app.state.router.placement.lookup(key) is not None
    _leave_once_generating(engine, inst, router,
                           {"stream": stream, "agent_hint": {**hint, "session_control": {"type": "stop"}}})

    def session() -> dict:
        return httpx.get(f"{inst.base_url}/v1/sessions/{sid}", timeout=30).json()

    assert wait_until(lambda: session()["state"] == "ended"), session()
    assert session()["held_tokens"] == 0
    assert wait_until(lambda: router.app.state.router.placement.lookup(key) is None)  # forgot the ended session
