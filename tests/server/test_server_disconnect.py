"""A client that goes away mid-request must abort it: the engine frees its KV blocks.

Raw sockets let the test close the connection at a moment it chooses (after the first chunk
of a stream, or while a non-streamed request is running). Each test also checks that fewer
tokens were generated than asked for, which only an abort can explain.
"""

from __future__ import annotations

import json
import re
import socket

import httpx
import pytest
from server_testing import API_KEY, LiveServer, wait_until

MAX_TOKENS = 400


def _generated_tokens(live_server: LiveServer) -> float:
    text = httpx.get(live_server.base_url + "/metrics", headers=live_server.headers).text
    return float(re.search(r"^hintkv_generation_tokens_total (\S+)$", text, re.M).group(1))


def _open_request(live_server: LiveServer, stream: bool) -> socket.socket:
    body = json.dumps(
        {
            "prompt": "Go on forever:",
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": stream,
            "ignore_eos": True,
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
