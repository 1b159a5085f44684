"""Tool-call parsing: `<tool_call>` JSON blocks become OpenAI tool calls, whole or streamed."""

from __future__ import annotations

import json

import pytest

from hintkv.server.api_requests import ChatCompletionRequest
from hintkv.server.tool_calls import ToolCallStreamer, parse_tool_calls

TWO_CALLS = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
)


def test_parses_calls_and_the_content_before_them():
    content, calls = parse_tool_calls(TWO_CALLS)
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")


def test_unclosed_last_call_still_parses():
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}')
    assert [c.name for c in calls] == ["f"]


@pytest.mark.parametrize(
    "text",
    [
        "no calls here",
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call><tool_call>[1]</tool_call>',
    ],
)
def test_malformed_calls_stay_content(text):
    assert parse_tool_calls(text) == (text, [])


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 1000])
def test_streamer_matches_whole_parse_for_any_split(piece):
    streamer = ToolCallStreamer()
    sent = "".join(streamer.feed(TWO_CALLS[i : i + piece]) for i in range(0, len(TWO_CALLS), piece))
    rest, calls = streamer.finish()
    assert sent + rest == "Let me check.\n"
    assert [c.name for c in calls] == ["get_weather", "get_time"]


def test_streamer_passes_plain_text_and_releases_a_partial_tag():
    streamer = ToolCallStreamer()
    assert streamer.feed("a < b and <tool") == "a < b and "
    assert streamer.finish() == ("<tool", [])


def test_streamer_gives_back_a_call_that_does_not_parse():
    streamer = ToolCallStreamer()
    assert streamer.feed("x <tool_call>oops") == "x "
    assert streamer.finish() == ("<tool_call>oops", [])


@pytest.mark.parametrize("parallel, names", [(None, ["get_weather", "get_time"]), (True, ["get_weather", "get_time"]),
                                             (False, ["get_weather"])])
def test_parallel_tool_calls_false_returns_the_first_call_only(parallel, names):
    """OpenAI's `parallel_tool_calls: false` (an agent that runs one tool a turn): the model may still write
    several calls; the reply carries the first, as vLLM's (review rev26 A3: the field was ignored)."""
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}],
                                                 "parallel_tool_calls": parallel})
    _, calls = parse_tool_calls(TWO_CALLS)
    assert [c.name for c in body.returned_calls(calls)] == names
