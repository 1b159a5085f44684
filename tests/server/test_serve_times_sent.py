"""The first chunk's stamp (`ServeTimes.first_sent`) is taken just before a chunk with output is
handed out of the streaming routes, not when a held-back delta (empty text) was skipped, and not
after the chunk was written (the client may read it before the route resumes: the parts then
overlapped the client's TTFT, af06b72); a whole response's when its first token was collected. The
routes' real stream functions, fed the events `generate_text` yields."""

from __future__ import annotations

import asyncio

from hintkv.server import routes_chat, routes_completions
from hintkv.server.api_requests import ChatCompletionRequest, CompletionRequest
from hintkv.server.generation import Finished, TextDelta, collect_text
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


def _drive(stream, times: ServeTimes) -> list[tuple[str, float | None]]:
    """Each chunk the route yields, with `first_sent` as the transport would see it on receipt."""
    async def run():
        return [(c, times.first_sent) async for c in stream]
    return asyncio.run(run())


def _stamp_on(chunks: list[tuple[str, float | None]], text: str) -> float | None:
    return next(stamp for c, stamp in chunks if text in c)


def test_completions_stream_stamps_the_first_chunk_before_it_goes_out():
    times, seen = _times(), []
    body = CompletionRequest(model="m", prompt="a", stream=True)
    chunks = _drive(routes_completions._stream(_events(times, seen), "r", "m", [1], body, _after), times)
    assert seen[0] is None  # the empty first token sent nothing
    assert _stamp_on(chunks, '"hi"') is not None  # stamped when "hi"'s chunk was handed out
    assert seen[1] == times.first_sent


def test_chat_stream_stamps_the_first_chunk_before_it_goes_out():
    times, seen = _times(), []
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "a"}], stream=True)
    chunks = _drive(routes_chat._stream(_events(times, seen), "r", "m", [1], body, _after), times)
    assert seen == [None, times.first_sent]
    assert _stamp_on(chunks, '"hi"') is not None


def test_a_stream_whose_only_chunk_is_the_last_stamps_it():
    times = _times()

    async def events():
        yield TextDelta("", [7], times)
        yield Finished("length", 3, 0, 1, None, times)
    body = CompletionRequest(model="m", prompt="a", stream=True)
    chunks = _drive(routes_completions._stream(events(), "r", "m", [1], body, _after), times)
    assert _stamp_on(chunks, '"finish_reason":"length"') is not None


def test_a_chat_stream_whose_first_output_is_its_tool_call_stamps_that_chunk():
    """The buffered call is the first chunk with output: the stamp precedes it."""
    times = _times()

    async def events():
        yield TextDelta('<tool_call>{"name": "ls", "arguments": {}}</tool_call>', [7], times)
        yield Finished("stop", 3, 0, 1, None, times)
    tool = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "a"}], stream=True,
                                 tools=[tool])
    chunks = _drive(routes_chat._stream(events(), "r", "m", [1], body, _after), times)
    assert _stamp_on(chunks, '"tool_calls":[{') is not None


def test_a_whole_response_stamps_its_first_token_collected():
    times, seen = _times(), []
    asyncio.run(collect_text(_events(times, seen)))
    assert seen[0] is not None and seen[1] == seen[0]
