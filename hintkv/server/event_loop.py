"""The event loop and HTTP parser the server runs on (`--loop`, `--http`; uvicorn's names).

`auto`, the default, takes uvloop (libuv's loop) and httptools (a C HTTP parser) where they are
installed, else asyncio's loop and h11. The event-loop thread shares the CPUs with the engine thread
and holds the GIL while it parses and writes, so what it spends on each request is time the engine's
first token waits for (docs/benchmarks/engine.md, the serving path).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable

LOOPS = ("auto", "asyncio", "uvloop")
HTTP_PARSERS = ("auto", "h11", "httptools")


def check(loop: str, http: str) -> None:
    """ValueError for an unknown name, or a library asked for by name that is not installed."""
    for flag, name, known in (("loop", loop, LOOPS), ("http", http, HTTP_PARSERS)):
        if name not in known:
            raise ValueError(f"{flag} must be one of {', '.join(known)}, not {name!r}")
        if name not in ("auto", "asyncio", "h11") and not _installed(name):
            raise ValueError(f"--{flag} {name}: {name} is not installed (pip install {name}; or --{flag} auto)")


def loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The new-loop function of `loop` (`auto`: uvloop's where installed)."""
    if loop == "uvloop" or (loop == "auto" and _installed("uvloop")):
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


# The most bytes of a request's line and headers: h11 in uvicorn stops an unfinished head at 16 KB
# (h11_max_incomplete_event_size: a 400); uvicorn's httptools protocol had no limit at all, so one request could make
# the server hold any amount before an ASGI line ran (a 64 MiB header: 200 OK; review rev_rev28_a A1).
MAX_HEADER_BYTES = 64 * 1024


def http_parser(http: str) -> str | type:
    """uvicorn's `http` setting for `http` (`auto`: httptools where installed): "h11", or httptools' protocol with
    the head capped at MAX_HEADER_BYTES (`capped_httptools`)."""
    if http == "auto":
        http = "httptools" if _installed("httptools") else "h11"
    return capped_httptools() if http == "httptools" else http


def capped_httptools() -> type:
    """uvicorn's httptools protocol answering 431 and closing once a request's URL and headers pass MAX_HEADER_BYTES.
    Counted in the parser's own callbacks, so a head split over many reads and one that arrives in a single read
    with its body are measured alike; the body is not counted (its cap is limits.MAX_BODY_BYTES)."""
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    class CappedHttpToolsProtocol(HttpToolsProtocol):
        _head_bytes = 0  # the head's bytes as the parser's callbacks hand them over
        _raw_head = 0  # the reads while the head is unfinished (one header's pieces wait in httptools until it ends)
        _in_head = True
        _head_too_large = False
        _running = None  # the cycle whose ASGI task runs (uvicorn's `cycle` is the newest one parsed)

        def _start_asgi_task(self, cycle, app) -> None:
            self._running = cycle
            super()._start_asgi_task(cycle, app)

        def connection_lost(self, exc: Exception | None) -> None:
            """uvicorn tells only the newest parsed request that its client left. With requests pipelined behind
            it, the one running was not told: its answer went to the closed transport, which uvloop refuses with a
            RuntimeError, and each such connection counted as an internal server error with a traceback logged."""
            running = self._running
            if running is not None and running is not self.cycle and not running.response_complete:
                running.disconnected = True
                running.message_event.set()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            self._head_bytes = 0
            self._in_head, self._raw_head = True, 0
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_head = False
            super().on_message_complete()

        def data_received(self, data: bytes) -> None:
            was_in_head = self._in_head  # a read that ends a body and starts the next head is not counted
            super().data_received(data)  # the parser first: a read that ends the head and carries body is fine
            if was_in_head and self._in_head and not self.transport.is_closing():
                self._raw_head += len(data)  # httptools buffers one header's pieces until it ends: count the reads
                if self._raw_head > MAX_HEADER_BYTES:
                    self._head_too_large = True
                    self.send_400_response("")

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)  # ": " and CRLF, as on the wire
            super().on_header(name, value)

        def _count(self, n: int) -> None:
            self._head_bytes += n
            if self._head_bytes > MAX_HEADER_BYTES:
                self._head_too_large = True
                raise ValueError("request head too large")  # the parser stops: uvicorn calls send_400_response

        def send_400_response(self, msg: str) -> None:
            if not self._head_too_large:
                return super().send_400_response(msg)
            msg = f"Request line and headers over {MAX_HEADER_BYTES} bytes."
            head = [STATUS_LINE[431], *(b"%s: %s\r\n" % kv for kv in self.server_state.default_headers),
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: %d\r\n" % len(msg), b"connection: close\r\n\r\n", msg.encode("ascii")]
            self.transport.write(b"".join(head))
            self.transport.close()

    return CappedHttpToolsProtocol


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
