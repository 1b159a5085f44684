"""`--loop` / `--http` (server/event_loop.py): uvicorn's names, `auto` takes uvloop / httptools where installed,
a name asked for that is not installed or not known is a clear error before anything is loaded."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from hintkv.cli import main
from hintkv.server import event_loop
from hintkv.server.options import ServerOptions

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None
HAS_HTTPTOOLS = importlib.util.find_spec("httptools") is not None


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="loop must be one of auto, asyncio, uvloop"):
        ServerOptions(loop="trio")
    with pytest.raises(ValueError, match="http must be one of auto, h11, httptools"):
        ServerOptions(http="h2")
    assert main(["serve", "--loop", "trio"]) == 2


def test_the_plain_choices_need_nothing_installed():
    loop = event_loop.loop_factory("asyncio")()
    try:
        assert isinstance(loop, asyncio.AbstractEventLoop)
        assert not type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()
    assert event_loop.http_parser("h11") == "h11"


def test_auto_takes_uvloop_and_httptools_where_installed():
    loop = event_loop.loop_factory("auto")()
    try:
        assert type(loop).__module__.startswith("uvloop") == HAS_UVLOOP
    finally:
        loop.close()
    parser = event_loop.http_parser("auto")
    if HAS_HTTPTOOLS:  # uvicorn's httptools protocol with the head capped (review rev_rev28_a A1)
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        assert isinstance(parser, type) and issubclass(parser, HttpToolsProtocol)
        assert event_loop.http_parser("httptools") is not HttpToolsProtocol
    else:
        assert parser == "h11"


@pytest.mark.skipif(HAS_UVLOOP, reason="uvloop is installed")
def test_uvloop_asked_for_but_missing_is_a_clear_error():
    with pytest.raises(ValueError, match="uvloop is not installed"):
        ServerOptions(loop="uvloop")


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")
def test_uvloop_asked_for_runs_uvloop():
    loop = event_loop.loop_factory("uvloop")()
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()
