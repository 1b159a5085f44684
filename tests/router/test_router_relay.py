"""The router with backends that fail: plain TCP servers that answer /health and then, for a POST,
die mid-stream, never answer, answer at once, or answer 503 (at capacity).

- A backend that dies mid-stream: the client gets an OpenAI-shaped error event and `[DONE]` (not a
  cut connection), a torn last event is dropped rather than relayed (the SDK would choke on it),
  and the backend is marked down (review rev25 A6, B4).
- An owed evict to a backend that hangs does not stop the other backends' health checks (B7), and
  an evict that times out leaves the backend up (slow is not dead: its sessions stay) and owed (B9)."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from hintkv.router import build_router_app
from hintkv.router.app import Identity
from hintkv.server.background import BackgroundServer

_EVENT = b'data: {"id": "c", "object": "text_completion", "choices": []}\n\n'


class DyingBackend:
    """`event`: what it sends of the stream before it dies; `hang`: it never answers a POST."""

    def __init__(self, event: bytes = _EVENT, hang: bool = False, answer: bool = False, full: bool = False) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.event, self.hang, self.answer, self.full = event, hang, answer, full
        self.completions = 0
        self.posts: list[dict] = []  # the POST bodies, in the order they came
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            request = conn.recv(65536)
            if request.startswith(b"GET"):
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: 2\r\nconnection: close\r\n\r\n{}")
                conn.close()
                continue
            self.completions += 1
            head, _, raw = request.partition(b"\r\n\r\n")
            length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), b"0"))
            while len(raw) < length:
                raw += conn.recv(65536)
            self.posts.append(json.loads(raw) if raw else {})
            if self.hang:
                self.held.append(conn)  # never answered: a busy instance
                continue
            if self.full:  # an instance at capacity: its load gate's 503
                with conn:
                    body = b'{"error": {"message": "server at capacity", "type": "server_overloaded"}}'
                    conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                                 b"retry-after: 1\r\nconnection: close\r\n"
                                 + f"content-length: {len(body)}\r\n\r\n".encode() + body)
                continue
            if self.answer:  # a management request's plain reply
                with conn:
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: 2\r\nconnection: close\r\n\r\n{}")
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n"
                             + f"{len(self.event):x}\r\n".encode() + self.event + b"\r\n")
                # closed here: no terminating chunk, as a process killed mid-stream leaves it

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.mark.parametrize("blank", [b"\n\n", b"\r\n\r\n"], ids=["lf", "crlf"])
def test_a_backend_dying_mid_stream_ends_the_stream_with_an_error_event(blank):
    backend = DyingBackend(event=_EVENT.replace(b"\n\n", blank))
    router = BackgroundServer(build_router_app([backend.url], health_interval_s=60.0,
                                               connect_timeout_s=1.0)).start()
    try:
        with httpx.stream("POST", f"{router.base_url}/v1/completions", timeout=30,
                          json={"model": "m", "prompt": "hi", "stream": True}) as r:
            assert r.status_code == 200
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
        assert backend.completions == 1
        assert events[-1] == "[DONE]", events
        assert json.loads(events[0])["id"] == "c", events  # the whole event before the cut came through
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_error" and backend.url in error["message"], error
        # marked down (counted as an error); not `up is False`: this backend answers /health, so the
        # router's first health check, which races the request, may have brought it back up already
        state = httpx.get(f"{router.base_url}/router/state", timeout=10).json()["backends"][backend.url]
        assert state["errors"] == 1, state
    finally:
        router.stop()
        backend.close()


def test_a_backend_dying_inside_an_event_gives_the_sdk_the_error_not_a_torn_event():
    backend = DyingBackend(event=b'data: {"id": "c", "object": "text_completion", "choi')
    router = BackgroundServer(build_router_app([backend.url], health_interval_s=60.0,
                                               connect_timeout_s=1.0)).start()
    try:
        client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="x", max_retries=0, timeout=30)
        with pytest.raises(openai.APIError) as raised:
            list(client.completions.create(model="m", prompt="hi", stream=True))
        assert backend.url in str(raised.value)
    finally:
        router.stop()
        backend.close()


def test_an_owed_evict_that_hangs_does_not_stop_the_other_backends_health_checks():
    busy, other = DyingBackend(hang=True), DyingBackend()
    app = build_router_app([busy.url, other.url], health_interval_s=0.2, connect_timeout_s=1.0)
    router = BackgroundServer(app).start()
    r = app.state.router
    try:
        assert httpx.get(f"{router.base_url}/health", timeout=10).status_code == 200  # starts the checks
        b = r.backends[busy.url]
        b.up = False  # marked down by slow checks, with an evict owed
        b.owed.append((None, "/v1/completions", {"prompt": "", "agent_hint": {
            "session_id": "s", "parent_session_id": "s", "session_control": {"type": "stop"}}}, {}))
        deadline = time.monotonic() + 10
        while busy.completions == 0 and time.monotonic() < deadline:  # the owed evict went out, and hangs
            time.sleep(0.05)
        assert busy.completions == 1
        other.close()  # the other instance dies: nothing listens on its port any more
        deadline = time.monotonic() + 10
        while r.backends[other.url].up and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not r.backends[other.url].up, "no health check ran while an owed evict hung"
    finally:
        router.stop()
        busy.close()


def test_an_evict_that_times_out_leaves_the_backend_up_and_owes_it():
    home, busy = DyingBackend(answer=True), DyingBackend(hang=True)
    app = build_router_app([home.url, busy.url], health_interval_s=60.0, connect_timeout_s=1.0)
    router = BackgroundServer(app).start()
    r = app.state.router
    try:
        e = httpx.post(f"{router.base_url}/v1/completions", timeout=60, json={"prompt": "", "agent_hint": {
            "session_id": "s", "parent_session_id": "s",
            "context_management": {"manage_request": True, "edits": [{"type": "evict", "target": "session"}]}}})
        assert e.status_code == 200 and e.headers["x-hintkv-backend"] == home.url, e.text
        assert busy.completions == 1  # the fan-out reached it, and it never answered
        b = r.backends[busy.url]
        assert b.up and len(b.owed) == 1, b
    finally:
        router.stop()
        home.close()
        busy.close()


def test_a_sessions_owed_evicts_reach_an_instance_before_its_next_request_there():
    """Actions of one session are sent in order: an evict owed to an instance goes out before the
    session's next request to it (sent after, it would end or cut what that request builds); another
    session's owed evict stays owed."""
    b = DyingBackend(answer=True)
    app = build_router_app([b.url], health_interval_s=60.0, connect_timeout_s=1.0)
    router = BackgroundServer(app).start()
    r = app.state.router

    def hint(sid, **more):
        return {"agent_hint": {"session_id": sid, "parent_session_id": sid, **more}}

    evict = {"context_management": {"manage_request": True, "edits": [{"type": "evict", "target": "session"}]}}
    r.backends.on_up = None  # only the request's own path pays here (the health checks' payer: tests above)
    try:
        for sid in ("s", "t"):
            r.backends[b.url].owed.append((Identity(hint(sid), {}).key, "/v1/completions",
                                           {"prompt": "", **hint(sid, **evict)}, {}))
        reply = httpx.post(f"{router.base_url}/v1/completions", timeout=30, json={"prompt": "hi", **hint("s")})
        assert reply.status_code == 200, reply.text
        assert [p.get("prompt") for p in b.posts] == ["", "hi"], b.posts
        assert b.posts[0]["agent_hint"]["session_id"] == "s"
        assert [o[0] for o in r.backends[b.url].owed] == [Identity(hint("t"), {}).key]
    finally:
        router.stop()
        b.close()


def test_a_stop_turn_whose_client_left_before_the_headers_still_reaches_the_sessions_instance():
    """A client that leaves while the router still waits for the instance's reply headers: the request may
    never have reached the instance (cancelled waiting for a connection), so its evict goes there as a
    management request too; an evict the instance did apply is a no-op the second time (review rev27 B4)."""
    home = DyingBackend(hang=True)
    router = BackgroundServer(build_router_app([home.url], health_interval_s=60.0, connect_timeout_s=1.0)).start()
    try:
        hint = {"session_id": "s", "parent_session_id": "s", "session_control": {"type": "stop"}}
        raw = json.dumps({"prompt": "hi", "max_tokens": 4, "agent_hint": hint}).encode()
        sock = socket.create_connection(("127.0.0.1", router.port), timeout=30)
        try:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
            deadline = time.monotonic() + 30
            while home.completions == 0 and time.monotonic() < deadline:  # the turn is at the instance
                time.sleep(0.05)
            assert home.completions == 1
        finally:
            sock.close()
        deadline = time.monotonic() + 30
        while len(home.posts) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(home.posts) == 2, home.posts
        evict = home.posts[1]
        assert "prompt" not in evict and evict["agent_hint"]["session_control"] == {"type": "stop"}
    finally:
        router.stop()
        home.close()


def test_a_request_of_no_session_that_meets_a_full_instance_goes_to_another():
    """An instance's 503 (its load gate: at capacity) was returned even for a request of no session, which
    holds no KV anywhere and any other instance serves as well (review rev26 A16's aside); a session's
    request stays with its instance's 503 and Retry-After (moving it would leave its KV behind)."""
    full, free = DyingBackend(full=True), DyingBackend(answer=True)
    router = BackgroundServer(build_router_app([full.url, free.url], health_interval_s=60.0,
                                               connect_timeout_s=1.0)).start()
    try:
        r = httpx.post(f"{router.base_url}/v1/completions", json={"prompt": "hi"}, timeout=30)
        assert (r.status_code, r.headers["x-hintkv-backend"]) == (200, free.url), r.text
        assert full.completions == 1 and free.completions == 1  # tried the full one first (least loaded, first)
        hint = {"session_id": "s", "parent_session_id": "s"}
        r = httpx.post(f"{router.base_url}/v1/completions", json={"prompt": "hi", "agent_hint": hint}, timeout=30)
        assert r.headers["x-hintkv-backend"] == full.url  # placed on the full one (no sessions on either, first)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"  # and it stays there
        assert free.completions == 1
    finally:
        router.stop()
        full.close()
        free.close()
