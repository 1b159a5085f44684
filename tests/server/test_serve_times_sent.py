"""The first chunk's stamp (`ServeTimes.first_sent`) is taken when a chunk with output really went
out of the streaming routes, not when a held-back delta (empty text) was skipped; and a whole
response's when its first token was collected. The routes' real stream functions, fed the events
`generate_text` yields."""

from __future__ import annotations

import asyncio

from hintkv.server import routes_chat, routes_completions
from hintkv.server.generation import Finished, TextDelta, collect_text
from hintkv.server.api_requests import ChatCompletionRequest, CompletionRequest
from hintkv.server.serve_times import ServeTimes


def _times() -> ServeTimes:
    t = ServeTimes(arrival=0.0)
    t.handed, t.first_out = 1.0, 2.0
    return t


async def _events(times: ServeTimes, seen: list):
    """An empty first token (held back), then text; records `first_sent` each time the consumer
    asks for the next event."""
    yield TextDelta("", [7], times)
    seen.append(times.first_sent)
    yield TextDelta("hi", [8], times)
    seen.append(times.first_sent)
    yield Finished("length", 3, 0, 2, None, times)


async def _after():
    return None


def _drive(stream) -> list[str]:
    async def run():
        return [c async for c in stream]
    return asyncio.run(run())


def test_completions_stream_stamps_the_first_chunk_that_went_out():
    times, seen = _times(), []
    body = CompletionRequest(model="m", prompt="a", stream=True)
    chunks = _drive(routes_completions._stream(_events(times, seen), "r", "m", [1], body, _after))
    assert seen[0] is None  # the empty first token sent nothing
    assert seen[1] is not None  # "hi"'s chunk went out before the next event was asked for
    assert any('"hi"' in c for c in chunks)


def test_chat_stream_stamps_the_first_chunk_that_went_out():
    times, seen = _times(), []
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "a"}], stream=True)
    _drive(routes_chat._stream(_events(times, seen), "r", "m", [1], body, _after))
    assert seen == [None, times.first_sent] and times.first_sent is not None


def test_a_stream_whose_only_chunk_is_the_last_stamps_it():
    times = _times()

    async def events():
        yield TextDelta("", [7], times)
        yield Finished("length", 3, 0, 1, None, times)
    body = CompletionRequest(model="m", prompt="a", stream=True)
    _drive(routes_completions._stream(events(), "r", "m", [1], body, _after))
    assert times.first_sent is not None


def test_a_whole_response_stamps_its_first_token_collected():
    times, seen = _times(), []
    asyncio.run(collect_text(_events(times, seen)))
    assert seen[0] is not None and seen[1] == seen[0]
