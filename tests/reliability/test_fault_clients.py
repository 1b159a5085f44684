"""Fault matrix, client side: many clients leaving mid-stream at once, and management requests
racing the running requests of the same sessions. Each case: greedy outputs identical to a
fault-free run, nothing leaks (no block in use, integrity, no internal error)."""

from __future__ import annotations

import asyncio
import json
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from faults import API_KEY, assert_nothing_leaked, body, greedy, manage, prompts

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer

PROMPTS = prompts(8)


@pytest.fixture(scope="module")
def server():
    engine = AsyncLLM.from_config(EngineConfig(
        model="dummy:tiny", dtype="float32", device="cpu", kv_cache_tokens=2048,
        max_model_len=512, max_num_seqs=8, debug_integrity=True))
    try:
        with BackgroundServer(build_app(engine, [API_KEY])) as srv:
            with httpx.Client(base_url=srv.base_url, timeout=120) as client:
                reference = [greedy(client, p) for p in PROMPTS]  # the fault-free run
                yield engine, client, srv, reference
    finally:
        asyncio.run(engine.shutdown())


def _open_stream(port: int, payload: dict) -> socket.socket:
    data = json.dumps(payload).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                 + data)
    assert sock.recv(64).startswith(b"HTTP/1.1 200")  # the stream has started
    return sock


def test_many_clients_leave_mid_stream_at_once(server):
    engine, client, srv, reference = server
    long = {**body(PROMPTS[0], stream=True), "max_tokens": 200}
    socks = [_open_stream(srv.port, {**long, "prompt": p}) for p in PROMPTS]
    for s in socks:  # all at once: RST, no goodbye
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    assert_nothing_leaked(client, engine)
    assert [greedy(client, p) for p in PROMPTS] == reference


def test_management_races_the_running_requests_of_its_sessions(server):
    engine, client, _, reference = server

    def run(i: int) -> list[int]:
        return greedy(client, PROMPTS[i % len(PROMPTS)], session=f"race-{i % 4}")

    def meddle(i: int) -> int:
        return manage(client, f"race-{i % 4}", ("evict", "offload", "prefetch")[i % 3]).status_code

    with ThreadPoolExecutor(12) as pool:
        outs = pool.map(run, range(24))
        codes = pool.map(meddle, range(60))
        outs, codes = list(outs), list(codes)
    assert codes == [200] * 60
    assert outs == [reference[i % len(PROMPTS)] for i in range(24)]
    for i in range(4):
        assert manage(client, f"race-{i}", "evict").status_code == 200
    assert_nothing_leaked(client, engine)
