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


def http_parser(http: str) -> str:
    """uvicorn's `http` setting for `http` (`auto`: httptools where installed)."""
    if http == "auto":
        return "httptools" if _installed("httptools") else "h11"
    return http


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
