"""rev26 A19 (the router half): a forwarded header with a non-ASCII byte (Authorization, x-session-id) makes
httpx's `build_request` raise UnicodeEncodeError, which `Router.forward` does not catch: a plain-text 500."""

from __future__ import annotations

import socket

import pytest

from hintkv.router import build_router_app
from hintkv.server.background import BackgroundServer


@pytest.mark.parametrize("header", [b"Authorization: Bearer caf\xe9", b"x-session-id: caf\xe9"])
def test_a_non_ascii_forwarded_header_is_not_a_500(header):
    with BackgroundServer(build_router_app(["http://127.0.0.1:9"])) as router:  # the instance is never reached
        body = b'{"prompt": "hi", "max_tokens": 1}'
        with socket.create_connection(("127.0.0.1", router.port), timeout=30) as s:
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n".encode() + header + b"\r\n\r\n" + body)
            status = s.recv(200).split(b"\r\n")[0]
        assert not status.startswith(b"HTTP/1.1 5") or status == b"HTTP/1.1 503 Service Unavailable", status
