"""The request head's cap on both HTTP parsers (review rev_rev28_a A1), and a non-ASCII API key (A2).

uvicorn's h11 stops an unfinished head at 16 KB (400); its httptools protocol, the default where installed, had no
cap: a 64 MiB header was a 200, held in memory before any ASGI code ran. `event_loop.capped_httptools` answers 431
past MAX_HEADER_BYTES, counted in the parser's callbacks (a head split over reads or sent with its body alike)."""

from __future__ import annotations

import socket

import httpx
import pytest

from hintkv.server import build_app
from hintkv.server.background import BackgroundServer
from hintkv.server.event_loop import MAX_HEADER_BYTES

pytest.importorskip("httptools")


def _send(port: int, data: bytes, timeout_s: float = 60.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        out = b""
        while b"\r\n\r\n" not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def _get(header_bytes: int) -> bytes:
    return b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * header_bytes + b"\r\nConnection: close\r\n\r\n"


@pytest.fixture(scope="module", params=["h11", "httptools"])
def server(request, live_server):
    with BackgroundServer(build_app(live_server.engine, []), http=request.param) as srv:
        srv.parser = request.param
        yield srv


@pytest.mark.parametrize("size", [2 * MAX_HEADER_BYTES, 2**20])
def test_a_head_past_the_cap_is_refused_and_the_server_goes_on(server, size):
    status = _send(server.port, _get(size)).split(b"\r\n", 1)[0]
    assert status == (b"HTTP/1.1 431 Request Header Fields Too Large" if server.parser == "httptools"
                      else b"HTTP/1.1 400 Bad Request"), status
    assert httpx.get(server.v1 + "/models").status_code == 200


def test_many_headers_count_together(server):
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 1000) for i in range(2 * MAX_HEADER_BYTES // 1000))
    reply = _send(server.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + headers + b"Connection: close\r\n\r\n")
    assert reply.split(b" ", 2)[1] in (b"400", b"431"), reply[:100]


def test_a_head_under_the_cap_is_served_with_a_large_body_in_the_same_write(server):
    """The cap counts the head only: 2 MiB of body sent with it is read (the body's own cap is 8 MiB)."""
    if server.parser == "httptools":
        assert _send(server.port, _get(MAX_HEADER_BYTES - 1024)).split(b"\r\n", 1)[0] == b"HTTP/1.1 200 OK"
    body = b'{"model": "dummy:tiny", "prompt": "' + b"a" * 2**21 + b'", "max_tokens": 1, "nonsense_field": 1}'
    reply = _send(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert reply.split(b"\r\n", 1)[0] not in (b"HTTP/1.1 431 Request Header Fields Too Large",), reply[:200]
    assert reply.split(b" ", 2)[1] != b"500", reply[:200]


def test_a_non_ascii_api_key_authenticates_when_sent_as_utf8(live_server):
    """A2: Starlette reads the header as latin-1; the key was compared as the UTF-8 of that text, never equal."""
    key = "sk-caf\u00e9"
    with BackgroundServer(build_app(live_server.engine, [key])) as srv:
        ok = httpx.get(srv.v1 + "/models", headers={"Authorization": ("Bearer " + key).encode("utf-8")})
        wrong = httpx.get(srv.v1 + "/models", headers={"Authorization": "Bearer sk-caf".encode() + b"\xe9"})
    assert ok.status_code == 200, ok.text
    assert wrong.status_code == 401


def test_one_header_value_that_never_ends_is_refused_before_it_is_held(live_server):
    """rev_rev28_b B1: httptools hands a header to on_header only once it ends, so a cap counted there let one
    unterminated value be buffered without limit. 1 MiB of one value, then the client stops sending (EOF): the
    431 must already be on the wire."""
    with BackgroundServer(build_app(live_server.engine, []), http="httptools") as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.settimeout(60)
            try:
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2**20)
            except OSError:  # the server closed the connection mid-send: it refused the head in time
                pass
            try:
                s.shutdown(socket.SHUT_WR)
                reply = s.recv(64)
            except OSError:
                reply = b"HTTP/1.1 431 (reset after the reply)"
    assert reply.startswith(b"HTTP/1.1 431"), reply
