"""Bad requests get a 4xx OpenAI error object, reach no engine, and the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest
from server_testing import KV_CACHE_TOKENS, MAX_MODEL_LEN, LiveServer

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


def _long_text(n_words: int) -> str:
    return " ".join(["word"] * n_words)


# (endpoint, body: dict or raw str, status, param, code)
BAD_REQUESTS = [
    (CHAT, '{"messages": [', 400, None, None),
    (CHAT, "[1, 2]", 400, None, None),
    (CHAT, {"messages": "hello"}, 400, "messages", None),
    (CHAT, {"messages": []}, 400, "messages", None),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", None),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", None),
    (CHAT, {"messages": USER, "temperature": "hot"}, 400, "temperature", None),
    (CHAT, {"messages": USER, "max_tokens": "ten"}, 400, "max_tokens", None),
    (CHAT, {"messages": USER, "stream": "yes"}, 400, "stream", None),
    (CHAT, {"messages": USER, "model": "gpt-9"}, 404, "model", "model_not_found"),
    (CHAT, {"messages": USER, "max_tokens": 0}, 400, "max_tokens", None),
    (CHAT, {"messages": USER, "max_completion_tokens": -3}, 400, "max_completion_tokens", None),
    (CHAT, {"messages": USER, "temperature": -0.5}, 400, "temperature", None),
    (CHAT, {"messages": USER, "top_p": 1.5}, 400, "top_p", None),
    (CHAT, {"messages": USER, "top_p": 0}, 400, "top_p", None),
    (CHAT, {"messages": USER, "n": 2}, 400, "n", None),
    (CHAT, {"messages": USER, "stop": ["ok", 3]}, 400, "stop", None),
    (CHAT, {"messages": USER, "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens", None),
    (
        CHAT,
        {"messages": [{"role": "user", "content": _long_text(MAX_MODEL_LEN + 50)}]},
        400,
        "messages",
        "context_length_exceeded",
    ),
    (CHAT, {"messages": USER, "logprobs": True}, 400, "logprobs", None),
    (CHAT, {"messages": USER, "presence_penalty": 2.5}, 400, "presence_penalty", None),
    (CHAT, {"messages": USER, "frequency_penalty": -3}, 400, "frequency_penalty", None),
    (CHAT, {"messages": USER, "repetition_penalty": 0}, 400, "repetition_penalty", None),
    (CHAT, {"messages": USER, "top_k": -2}, 400, "top_k", None),
    (CHAT, {"messages": USER, "min_p": 1.5}, 400, "min_p", None),
    (CHAT, {"messages": USER, "min_tokens": -1}, 400, "min_tokens", None),
    (CHAT, {"messages": USER, "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens", None),
    (CHAT, {"messages": USER, "logit_bias": {"abc": 5}}, 400, "logit_bias", None),
    (CHAT, {"messages": USER, "logit_bias": {"5": 101}}, 400, "logit_bias", None),
    (CHAT, {"messages": USER, "logit_bias": {"49152": 1}}, 400, "logit_bias", None),
    (CHAT, {"messages": USER, "logit_bias": [5]}, 400, "logit_bias", None),
    (CHAT, {"messages": USER, "logit_bias": {"9" * 5000: 5}}, 400, "logit_bias", None),  # past int()'s digit limit
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"9" * 5000: 5}}, 400, "logit_bias", None),
    (CHAT, {"messages": USER, "response_format": {"type": "json_object"}}, 400, "response_format", None),
    (CHAT, {"messages": USER, "logit_bias": {"5": 1, "05": -100}}, 400, "logit_bias", None),  # one token twice
    *[(CHAT, {"messages": USER, field: value}, 400, field, None) for field, value in (
        ("structured_outputs", {"choice": ["yes", "no"]}), ("allowed_token_ids", [42]), ("bad_words", ["the"]),
        ("prompt_logprobs", 2), ("use_beam_search", True), ("include_stop_str_in_output", True),
        ("skip_special_tokens", False), ("truncate_prompt_tokens", 2))],  # vLLM's fields that change the output
    (COMPLETIONS, '{"prompt": "x",', 400, None, None),
    (COMPLETIONS, {"prompt": "x", "echo": True}, 400, "echo", None),
    (COMPLETIONS, {"prompt": "x", "best_of": 3}, 400, "best_of", None),
    (COMPLETIONS, {"prompt": "x", "max_completion_tokens": MAX_MODEL_LEN}, 400, "max_completion_tokens", None),
    (COMPLETIONS, {}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": []}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": [1, True]}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": [1, 10**9]}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": ["a", "b"]}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": "x", "model": "nope"}, 404, "model", "model_not_found"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", None),
    (COMPLETIONS, {"prompt": "x", "temperature": -1.0}, 400, "temperature", None),
    (COMPLETIONS, {"prompt": "x", "top_p": 2.0}, 400, "top_p", None),
    (COMPLETIONS, {"prompt": "x", "n": 3}, 400, "n", None),
    (COMPLETIONS, {"prompt": "x", "stop": ""}, 400, "stop", None),
    # Longer than the whole KV pool (512) but shorter than max_model_len (1024).
    (
        COMPLETIONS,
        {"prompt": [42] * (KV_CACHE_TOKENS + 10)},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    (COMPLETIONS, {"prompt": [42] * (MAX_MODEL_LEN + 10)}, 400, "prompt", None),
]


def _ids(case: tuple) -> str:
    endpoint, body, status, param, _ = case
    return f"{endpoint.rsplit('/', 1)[-1]}-{status}-{param}"


@pytest.fixture(scope="module")
def http(live_server: LiveServer):
    with httpx.Client(base_url=live_server.base_url, headers=live_server.headers, timeout=60) as c:
        yield c


def _serves_a_good_request(http: httpx.Client) -> bool:
    r = http.post(COMPLETIONS, json={"prompt": "still there?", "max_tokens": 1, "temperature": 0})
    return r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[_ids(c) for c in BAD_REQUESTS])
def test_bad_request_is_an_openai_error(http, live_server, case):
    endpoint, body, status, param, code = case
    content = body if isinstance(body, str) else json.dumps(body)
    queried_before = live_server.engine.stats().prefix_query_tokens
    r = http.post(endpoint, content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    assert live_server.engine.stats().prefix_query_tokens == queried_before  # nothing reached it
    assert _serves_a_good_request(http)


def test_body_without_json_content_type_is_still_json(http):
    r = http.post(
        COMPLETIONS,
        content=b'{"prompt": "a", "max_tokens": 1}',
        headers={"Content-Type": "text/plain"},
    )
    assert r.status_code == 200


@pytest.mark.parametrize("auth", [None, "Bearer wrong-key", "Basic dGVzdC1rZXk6"])
def test_missing_or_wrong_key_is_401(live_server, auth):
    headers = {} if auth is None else {"Authorization": auth}
    for method, path in (("POST", CHAT), ("POST", COMPLETIONS), ("GET", "/v1/models")):
        body = {"messages": USER} if path == CHAT else {"prompt": "x"}
        r = httpx.request(method, live_server.base_url + path, json=body, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"


def test_unknown_route_is_an_openai_404(http):
    r = http.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"
