"""Input hardening at the edge: every hostile body the attack report found is a 4xx naming
its field (never a 500), nothing it asked for is applied, and the server keeps serving."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_testing import API_KEY, LiveServer

from hintkv.server.api_requests import MAX_STOP_STRING_CHARS

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
LONE = "\ud800"  # an unpaired surrogate: json.dumps writes it as the escape \\ud800


def _nested(depth: int) -> str:
    return '{"messages": [{"role": "user", "content": "x"}], "extra": ' + "[" * depth + "]" * depth + "}"


def _hint(session: str) -> dict:
    return {"session_id": session, "parent_session_id": session}


def _evict(session: str) -> dict:
    hint = {"session_id": session, "parent_session_id": "root"}
    hint["context_management"] = {
        "manage_request": True, "edits": [{"type": "evict", "target": "session"}]}
    return hint


# (endpoint, body: dict or raw JSON text, status, param)
HOSTILE = [
    (CHAT, _nested(40), 400, "extra" + "[0]" * 31),
    # Deeper than json's recursion limit: the depth is measured on the raw text before parsing, so
    # the answer names the same field whatever the process's recursion limit is.
    (CHAT, _nested(1000), 400, "extra" + "[0]" * 31),
    (CHAT, _nested(100_000), 400, "extra" + "[0]" * 31),
    (CHAT, '{"messages": [{"role": "user", "content": "]]}"}], "t\\"": [{"k\\\\": '
     + '[{"q": ' * 20 + "0" + "}]" * 20 + "}]}", 400, 't"[0].k\\[0]' + ".q[0]" * 14),
    (CHAT, {"messages": [{"role": "user", "content": "a" + LONE}]}, 400, "messages[0].content"),
    (COMPLETIONS, {"prompt": LONE}, 400, "prompt"),
    (CHAT, {"messages": USER, "model": LONE}, 400, "model"),
    (CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": LONE}}]}, 400,
     "tools[0].function.name"),
    (CHAT, {"messages": USER, LONE: 1}, 400, "\\ud800"),
    (CHAT, {"messages": [], "agent_hint": _evict("s" + LONE)}, 400, "agent_hint.session_id"),
    (CHAT, {"messages": USER, "temperature": 3.0}, 400, "temperature"),
    (CHAT, {"messages": USER, "stop": ["ok", "s" * (MAX_STOP_STRING_CHARS + 1)]}, 400, "stop"),
    (COMPLETIONS, {"prompt": "x", "stop": "s" * 1_000_000}, 400, "stop"),
    (CHAT, '{"messages": [{"role": "user", "content": "x"}], "temperature": Infinity}', 400, None),
    (CHAT, '{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, None),
    (CHAT, '{"messages": [{"role": "user", "content": "x"}], "temperature": 1e999}', 400, None),
    (COMPLETIONS, {"prompt": "x", "seed": 2**64}, 400, "seed"),
    (COMPLETIONS, {"prompt": "x", "seed": -(2**63) - 1}, 400, "seed"),
    (COMPLETIONS, '{"prompt": "x", "seed": 1' + "0" * 5000 + "}", 400, None),
    (COMPLETIONS, b'{"prompt": "\xff\xfe"}', 400, None),
    (CHAT, {"messages": USER, "agent_hint": {"session_id": "s" * 10_000,
                                             "parent_session_id": "s"}}, 400,
     "agent_hint.session_id"),
    (CHAT, {"messages": USER, "agent_hint": {**_hint("e"), "context_management": {
        "manage_request": True, "edits": [{"type": "evict", "target": "session"}] * 1000}}}, 400,
     "agent_hint.context_management.edits"),
]


def _ids(case: tuple) -> str:
    endpoint, _body, status, param = case
    return f"{endpoint.rsplit('/', 1)[-1]}-{status}-{param}"[:80]


@pytest.fixture(scope="module")
def http(live_server: LiveServer):
    with httpx.Client(base_url=live_server.base_url, headers=live_server.headers, timeout=60) as c:
        yield c


def internal_errors(live: LiveServer) -> float:
    text = httpx.get(live.base_url + "/metrics", headers=live.headers).text
    line = next(x for x in text.splitlines() if x.startswith("hintkv_internal_errors_total"))
    return float(line.split()[-1])


def _serves(http: httpx.Client) -> bool:
    r = http.post(COMPLETIONS, json={"prompt": "still there?", "max_tokens": 1, "temperature": 0})
    return r.status_code == 200


@pytest.mark.parametrize("case", HOSTILE, ids=[_ids(c) for c in HOSTILE])
def test_hostile_body_is_a_4xx_naming_the_field(http, live_server, case):
    endpoint, body, status, param = case
    if isinstance(body, dict):
        content = json.dumps(body).encode()
    else:
        content = body if isinstance(body, bytes) else body.encode()
    before = internal_errors(live_server)
    r = http.post(endpoint, content=content)
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param, err
    assert internal_errors(live_server) == before == 0
    assert _serves(http)  # on the same keep-alive connection


def test_a_stop_string_of_the_longest_length_is_served(http):
    r = http.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 2, "stop": ["s" * MAX_STOP_STRING_CHARS]})
    assert r.status_code == 200, r.text


def test_a_refused_evict_changes_nothing(http, live_server):
    """The session exists; an evict whose reply could not be sent (lone surrogate in the id
    of another request) is refused before it is applied, and the session keeps its blocks."""
    r = http.post(CHAT, json={"messages": USER, "max_tokens": 2, "temperature": 0,
                              "agent_hint": _hint("keep-me")})
    assert r.status_code == 200
    before = http.get("/v1/sessions/keep-me").json()
    bad = json.dumps({"messages": [], "agent_hint": {**_evict("keep-me"), "x": LONE}})
    assert http.post(CHAT, content=bad).status_code == 400
    assert http.get("/v1/sessions/keep-me").json() == before


def test_tiny_temperature_fails_no_other_request(http, live_server):
    """temperature 1e-40 once made the sampler hit NaN and abort the whole batch."""
    def one(i: int) -> int:
        temp = 1e-40 if i % 2 else 0.7
        r = http.post(COMPLETIONS, json={"prompt": f"count {i}", "max_tokens": 8,
                                          "temperature": temp, "seed": i, "ignore_eos": True})
        return r.status_code

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(one, range(12))) == [200] * 12
    assert internal_errors(live_server) == 0


def test_non_list_tool_calls_with_a_session_is_served(http, live_server):
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": 7},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    r = http.post(CHAT, json={"messages": messages, "max_tokens": 2, "temperature": 0,
                              "agent_hint": _hint("tools-odd")})
    assert r.status_code in (200, 400), r.text
    assert internal_errors(live_server) == 0


def test_salt_and_session_cannot_spell_another_tenants_session(http, live_server):
    """salt 'a\\x1fb' + session 'c' once had the same key as salt 'a' + session 'b\\x1fc'."""
    r = http.post(CHAT, json={"messages": USER, "max_tokens": 2, "temperature": 0,
                              "cache_salt": "a\x1fb", "agent_hint": _hint("c")})
    assert r.status_code == 200
    assert http.get("/v1/sessions/c", params={"cache_salt": "a\x1fb"}).status_code == 200
    r = http.get("/v1/sessions/b%1Fc", params={"cache_salt": "a"})
    assert r.status_code == 404
    evict = {"messages": [], "cache_salt": "a", "agent_hint": _evict("b\x1fc")}
    assert http.post(CHAT, json=evict).status_code == 200
    assert http.get("/v1/sessions/c", params={"cache_salt": "a\x1fb"}).status_code == 200


def test_metrics_need_a_key_unless_public(live_server):
    assert httpx.get(live_server.base_url + "/metrics").status_code == 401
    r = httpx.get(live_server.base_url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200 and "hintkv_internal_errors_total 0.0" in r.text
    assert httpx.get(live_server.base_url + "/health").status_code == 200  # liveness stays open


def test_sessions_route_needs_a_key(live_server):
    assert httpx.get(live_server.v1 + "/sessions/x").status_code == 401
