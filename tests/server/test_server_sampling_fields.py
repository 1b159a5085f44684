"""OpenAI's and vLLM's sampling fields through the `openai` SDK against a live server (dummy:tiny):
each one changes the output as it says (or is refused with a 400 when out of range:
test_server_bad_input.py); none is accepted and ignored."""

from __future__ import annotations

import openai
import pytest
from server_testing import API_KEY, LiveServer

PROMPT = "The sky is"
N = 6


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.v1, api_key=API_KEY, max_retries=0, timeout=60)


def _ids(client: openai.OpenAI, live_server: LiveServer, **extra) -> list[int]:
    r = client.completions.create(model=live_server.engine.model_name, prompt=PROMPT, max_tokens=N, temperature=0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True, **extra.pop("body", {})},
                                  **extra)
    return r.choices[0].model_extra["token_ids"]


def test_logit_bias_forces_and_bans_tokens(client, live_server):
    plain = _ids(client, live_server)
    assert _ids(client, live_server, logit_bias={"42": 100}) == [42] * N
    banned = _ids(client, live_server, logit_bias={str(plain[0]): -100})
    assert plain[0] not in banned


def test_penalties_change_a_repeating_greedy_output(client, live_server):
    plain = _ids(client, live_server)
    assert len(set(plain)) < N  # dummy:tiny's greedy output repeats: the penalties have work to do
    for extra in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"body": {"repetition_penalty": 2.0}}):
        shaped = _ids(client, live_server, **extra)
        assert shaped != plain, extra
        assert len(set(shaped)) > len(set(plain)), extra


def test_min_tokens_holds_back_a_stop_token(client, live_server):
    first = _ids(client, live_server)[0]
    stopped = _ids(client, live_server, body={"stop_token_ids": [first], "ignore_eos": False})
    assert stopped == [first]
    held = _ids(client, live_server, body={"stop_token_ids": [first], "min_tokens": 3})
    assert len(held) >= 3 and first not in held[:3]


def test_top_k_one_and_tiny_min_p_sample_the_greedy_token(client, live_server):
    plain = _ids(client, live_server)
    for body in ({"top_k": 1}, {"min_p": 1.0}):
        r = client.completions.create(model=live_server.engine.model_name, prompt=PROMPT, max_tokens=N,
                                      temperature=1.5, seed=7,
                                      extra_body={"return_token_ids": True, "ignore_eos": True, **body})
        assert r.choices[0].model_extra["token_ids"] == plain, body


def test_min_tokens_holds_back_a_stop_string(client, live_server):
    """vLLM's rule: the text of the first min_tokens outputs is not searched for stop strings; one in
    the text after them still ends the request (and is cut from it)."""
    def complete(**body):
        r = client.completions.create(model=live_server.engine.model_name, prompt=PROMPT, max_tokens=N,
                                      temperature=0, extra_body={"ignore_eos": True, **body})
        return r.choices[0].text, r.usage.completion_tokens, r.choices[0].finish_reason

    text, _, _ = complete()
    stop = text.strip()[:1]
    assert stop  # greedy dummy:tiny text starts with a visible character
    assert complete(stop=[stop])[1] < 3  # without min_tokens it ends the request at once
    held_text, held_tokens, reason = complete(stop=[stop], min_tokens=3)
    assert held_tokens >= 3 and stop in held_text  # the free outputs' text keeps its stop string
    assert text.startswith(held_text)  # greedy: the same tokens, cut where a later stop string begins
    assert text[len(held_text):].startswith(stop) if reason == "stop" else held_text == text


def test_max_completion_tokens_limits_a_completion_too(client, live_server):
    """OpenAI's legacy endpoint has no `max_completion_tokens`, but a client that sends chat's newer name
    gets its limit here too, not the 16-token default (review rev26 A9); it wins over `max_tokens`."""
    def ids(**limits) -> list[int]:
        r = client.completions.create(model=live_server.engine.model_name, prompt=PROMPT, temperature=0,
                                      extra_body={"return_token_ids": True, "ignore_eos": True, **limits})
        return r.choices[0].model_extra["token_ids"]

    assert len(ids(max_completion_tokens=2)) == 2
    assert len(ids(max_completion_tokens=3, max_tokens=N)) == 3
