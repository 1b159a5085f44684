"""The router's stream relay when its backend dies mid-stream: the client gets an OpenAI-shaped
error event and `[DONE]` (not a cut connection), and the backend is marked down (review rev25 A6).
The backend is a plain TCP server that answers /health and, for a completion, sends the stream's
headers and one event, then closes the connection without the chunked stream's end."""

from __future__ import annotations

import json
import socket
import threading

import httpx

from hintkv.router import build_router_app
from hintkv.server.background import BackgroundServer

_EVENT = b'data: {"id": "c", "object": "text_completion", "choices": []}\n\n'


class DyingBackend:
    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.completions = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                request = conn.recv(65536)
                if request.startswith(b"GET"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: 2\r\nconnection: close\r\n\r\n{}")
                    continue
                self.completions += 1
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n"
                             + f"{len(_EVENT):x}\r\n".encode() + _EVENT + b"\r\n")
                # closed here: no terminating chunk, as a process killed mid-stream leaves it

    def close(self) -> None:
        self.sock.close()


def test_a_backend_dying_mid_stream_ends_the_stream_with_an_error_event():
    backend = DyingBackend()
    router = BackgroundServer(build_router_app([backend.url], health_interval_s=60.0,
                                               connect_timeout_s=1.0)).start()
    try:
        with httpx.stream("POST", f"{router.base_url}/v1/completions", timeout=30,
                          json={"model": "m", "prompt": "hi", "stream": True}) as r:
            assert r.status_code == 200
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
        assert backend.completions == 1
        assert events[-1] == "[DONE]", events
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_error" and backend.url in error["message"], error
        state = httpx.get(f"{router.base_url}/router/state", timeout=10).json()["backends"][backend.url]
        assert state["up"] is False and state["errors"] == 1, state
    finally:
        router.stop()
        backend.close()
