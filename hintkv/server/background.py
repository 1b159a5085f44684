"""A server running in a background thread of this process, for tests, benchmarks and replays.

    with BackgroundServer(build_app(engine, api_keys)) as srv:
        openai.OpenAI(base_url=srv.v1, api_key=key).chat.completions.create(...)

uvicorn serves the app on a free loopback port (bound before the thread starts, so there is no
race for the port); leaving the block stops the server. The engine is not owned: whoever built
it shuts it down.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Self

import uvicorn

from hintkv.server.event_loop import http_parser

START_TIMEOUT_S = 30.0


class BackgroundServer:
    def __init__(self, app: Any, host: str = "127.0.0.1", http: str = "auto") -> None:
        """`http`: the parser, as `hintkv serve --http` names it (auto: httptools where installed, else h11)."""
        self.app = app
        self.http = http
        self.host = host
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def start(self) -> Self:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        # upkeep runs; the parser `hintkv serve` would take for self.http (its header cap too)
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", http=http_parser(self.http))
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError("the background server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
