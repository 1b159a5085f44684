"""A client that pipelines requests and then leaves is a client that left, never an internal server error.

uvicorn's httptools protocol (the default parser) tells only the newest parsed request that its connection was lost.
With requests pipelined behind it, the one running was not told: its answer went to the closed transport, uvloop
refused the write with a RuntimeError, and the server counted an internal error and logged a traceback for every such
connection (found with raw requests against a live server: 30 connections, 30 internal errors; h11 had none).
`event_loop.capped_httptools` now tells the running request too."""

from __future__ import annotations

import re
import socket
import time

import httpx
import pytest
from server_testing import API_KEY

from hintkv.server import build_app
from hintkv.server.background import BackgroundServer

HANG_S = 60  # a bound on waiting for the server, not a timing
BODY = b'{"prompt": "hi", "max_tokens": 2}'
REQUEST = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
           + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)


def _metrics(srv: BackgroundServer) -> tuple[float, float]:
    """(internal errors, /v1/completions answers counted, any status)."""
    text = httpx.get(srv.base_url + "/metrics", headers={"authorization": f"Bearer {API_KEY}"}, timeout=30).text
    errors = float(re.search(r"^hintkv_internal_errors_total (\S+)$", text, re.M).group(1))
    answers = sum(float(v) for v in re.findall(
        r'^hintkv_http_requests_total\{endpoint="/v1/completions",status="\d+"\} (\S+)$', text, re.M))
    return errors, answers


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_pipelined_requests_whose_client_left_are_no_internal_errors(live_server, http):
    if http == "httptools":
        pytest.importorskip("httptools")
    with BackgroundServer(build_app(live_server.engine, [API_KEY]), http=http) as srv:
        errors, answers = _metrics(srv)
        connections = 3
        for _ in range(connections):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=HANG_S) as s:
                s.sendall(REQUEST * 3)  # pipelined: the first runs, two wait behind it
                s.shutdown(socket.SHUT_WR)  # the client leaves
                while s.recv(65536):
                    pass
        deadline = time.monotonic() + HANG_S
        while _metrics(srv)[1] < answers + connections and time.monotonic() < deadline:
            time.sleep(0.05)  # each connection's first request has run to its end (counted, whatever its status)
        now_errors, now_answers = _metrics(srv)
        assert now_answers >= answers + connections
        assert now_errors == errors, f"{now_errors - errors:g} internal errors for {connections} clients that left"
        assert httpx.post(srv.v1 + "/completions", headers={"authorization": f"Bearer {API_KEY}"},
                          json={"prompt": "still there?", "max_tokens": 1}, timeout=HANG_S).status_code == 200
