"""rev26 A19: a bearer token with a non-ASCII byte (the header is read as latin-1) makes `hmac.compare_digest`
raise TypeError ("comparing strings with non-ASCII characters is not supported"): every route that checks the
key answers 500 to an unauthenticated client, and `hintkv_internal_errors_total` counts it."""

from __future__ import annotations

import socket

import pytest


def _status(port: int, method: str, path: str, body: bytes = b"") -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode() + b"Authorization: Bearer caf\xe9\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + body)
        return s.recv(200).split(b"\r\n")[0]


@pytest.mark.parametrize("method,path,body", [("GET", "/v1/models", b""), ("GET", "/metrics", b""),
                                              ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 1}')])
def test_a_non_ascii_bearer_token_is_a_401(live_server, method, path, body):
    assert _status(live_server.port, method, path, body) == b"HTTP/1.1 401 Unauthorized"
