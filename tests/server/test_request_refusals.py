"""Request fields refused, not ignored or run unbounded, and nullable ones read as their defaults (review
rev26 A2, A3, A5, A6; each failed on d9b7ee5, the stop token ids on 26ac118; review rev27 A6 on 22d289d)."""

from __future__ import annotations

import httpx
import pytest
from server_testing import API_KEY

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _chat(live_server, **extra):
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 8,
            "temperature": 0, **extra}
    return httpx.post(live_server.v1 + "/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_a_forced_tool_choice_is_refused_not_ignored(live_server, choice):
    """README: fields that would change the output and are not implemented are a 400. A forced tool
    choice (OpenAI: the model MUST call a tool / this tool) is not implemented: the reply is plain text."""
    r = _chat(live_server, tools=TOOLS, tool_choice=choice)
    assert r.status_code == 400, r.json()["choices"][0]
    assert r.json()["error"]["param"] == "tool_choice"


def test_an_invalid_tool_choice_is_a_400(live_server):
    r = _chat(live_server, tools=TOOLS, tool_choice="sometimes")
    assert r.status_code == 400, r.text[:300]


def test_a_named_tool_choice_without_tools_is_a_400(live_server):
    r = _chat(live_server, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.status_code == 400, r.text[:300]


def test_a_request_cannot_send_tens_of_thousands_of_stop_strings(live_server):
    """Each output token searches every stop string on the event loop: 65,536 stops of 100 characters
    (6.8 MB, under the 8 MiB body cap) cost ~25 ms of loop time per token (measured: /health p50
    6.6 s while one such 200-token request ran). OpenAI allows 4 stop strings."""
    stops = ["%06d" % i + "x" * 94 for i in range(65536)]
    r = _chat(live_server, stop=stops, max_tokens=1)
    assert r.status_code == 400, r.text[:300]



def test_a_request_cannot_send_tens_of_thousands_of_stop_token_ids(live_server):
    """The engine thread checks each new token against every stop token id, under the state lock: 65,536
    ids cost ~1.3 ms per token per sequence (review rev26 A2). Capped as the stop strings are."""
    r = _chat(live_server, stop_token_ids=list(range(65536)), max_tokens=1)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["param"] == "stop_token_ids"
    assert "64" in r.json()["error"]["message"]
    assert _chat(live_server, stop_token_ids=list(range(64)), max_tokens=1).status_code == 200


@pytest.mark.parametrize("field", ["n", "stream", "return_token_ids"])
def test_null_for_a_nullable_openai_field_is_its_default(live_server, field):
    """OpenAI's schema has `n` and `stream` as "integer or null" / "boolean or null" (vLLM: Optional with a
    default), as the other sampling fields here; a client that sends unset fields as null got a 400
    (review rev26 A5)."""
    r = _chat(live_server, **{field: None})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["object"] == "chat.completion"  # one whole reply, not a stream


def test_stream_options_without_stream_is_a_400(live_server):
    """OpenAI and vLLM refuse stream_options unless stream is true (review rev26 A6: it was ignored)."""
    r = _chat(live_server, stream_options={"include_usage": True})
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["param"] == "stream_options"
    assert _chat(live_server, stream_options=None).status_code == 200


@pytest.mark.parametrize("key", ["tools", "add_generation_prompt", "messages", "template", "self"])
def test_chat_template_kwargs_cannot_set_the_renderers_own_arguments(live_server, key):
    """A 400 naming the field and saying what to send instead, not Python's "got multiple values for keyword
    argument" (review rev27 A6; `template` and `self`: rev27 B6)."""
    r = _chat(live_server, chat_template_kwargs={key: False})
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["param"] == "chat_template_kwargs"
    assert repr(key) in r.json()["error"]["message"] and "multiple values" not in r.json()["error"]["message"]
