"""The Agent Hint through a live server (dummy:tiny, real tokenizer): sessions, edits, tenancy.

Requests are built by the `openai` SDK (hints in `extra_body`) or by `hintkv.client`'s
SessionClient / AsyncSessionClient, the way an agent framework sends them; what the cache did
is read back from `GET /v1/sessions/{id}` and the engine's stats.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import openai
import pytest
from server_testing import API_KEY, BLOCK_SIZE, OTHER_API_KEY, LiveServer

from hintkv.client import (
    AsyncSessionClient,
    SessionClient,
    hint,
    manage_hint,
    messages_edit,
    session_edit,
    sub_agent,
    tokens_edit,
    tools_edit,
)
from hintkv.protocol.ranges import stale_token_start
from hintkv.server.hint_edits import IGNORED_NOTE, chat_render

TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                         "parameters": {"type": "object", "properties": {}}}}


def _sid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _client(live: LiveServer, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.v1, api_key=key, max_retries=0, timeout=60)


def _chat(live: LiveServer, session: str, text: str, *, key: str = API_KEY, parent: str | None = None,
          **extra_body):
    return _client(live, key).chat.completions.create(
        model=live.engine.model_name,
        messages=[{"role": "user", "content": text}],
        max_tokens=2,
        temperature=0,
        extra_body={**hint(session, parent), **extra_body},
    )


def _manage(live: LiveServer, session: str, edits: list[dict], *, key: str = API_KEY,
            parent: str | None = None, **extra_body) -> dict:
    r = httpx.post(live.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": live.engine.model_name, "messages": [],
                         **manage_hint(session, parent, edits), **extra_body}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _session(live: LiveServer, session: str, *, key: str = API_KEY, salt: str | None = None):
    params = {"cache_salt": salt} if salt is not None else {}
    return httpx.get(f"{live.v1}/sessions/{session}", params=params,
                     headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _long_text(n_words: int, seed: str) -> str:
    return " ".join(f"{seed}{i}" for i in range(n_words))


def _integrity(live: LiveServer) -> None:
    asyncio.run(live.engine.check_integrity())


# ---- management replies ------------------------------------------------------------------------

def test_management_reply_is_an_empty_envelope_plus_the_result(live_server):
    sid = _sid("shape")
    _chat(live_server, sid, _long_text(40, "shape"))
    body = _manage(live_server, sid, [session_edit("offload")], parent="main-0")
    assert body["id"].startswith("chatcmpl-") and isinstance(body["created"], int)
    assert body["object"] == "chat.completion" and body["model"] == live_server.engine.model_name
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    result = body["agent_hint_result"]
    assert (result["session_id"], result["parent_session_id"], result["manage_request"]) == (
        sid, "main-0", True)
    [edit] = result["edits"]
    assert (edit["type"], edit["target"], edit["action"]) == ("offload", "session", "offloaded")
    assert _session(live_server, sid).json()["state"] == "suspended"


def test_sdk_and_session_client_take_the_reply_as_success(live_server):
    sid = _sid("sdk")
    client = _client(live_server)
    _chat(live_server, sid, "hello there")
    reply = client.chat.completions.create(
        model=live_server.engine.model_name, messages=[],
        extra_body=manage_hint(sid, None, [session_edit("prefetch")]))
    assert reply.choices[0].message.content == "" and reply.choices[0].finish_reason == "stop"
    assert reply.model_extra["agent_hint_result"]["edits"][0]["action"] == "prefetched"
    sc = SessionClient(client, live_server.engine.model_name)
    for action in (sc.suspend, sc.prepare, sc.release):
        res = action(sid)
        assert res.ok, res.error
        assert res.agent_hint_result["edits"][0]["action"] in ("offloaded", "prefetched", "evicted")


def test_unknown_session_and_repeated_evict_are_successful_no_ops(live_server):
    before = live_server.engine.stats()
    body = _manage(live_server, _sid("never-seen"), [session_edit("evict"), session_edit("offload")])
    assert [e["action"] for e in body["agent_hint_result"]["edits"]] == ["none", "none"]
    assert live_server.engine.stats() == before
    sid = _sid("twice")
    _chat(live_server, sid, "evict me twice")
    first = _manage(live_server, sid, [session_edit("evict")])["agent_hint_result"]["edits"][0]
    second = _manage(live_server, sid, [session_edit("evict")])["agent_hint_result"]["edits"][0]
    assert first["action"] == "evicted"
    assert second["tiers"]["device"] == {"blocks": 0, "tokens": 0}


# ---- what edits do to the cache ------------------------------------------------------------------

def test_inference_attributes_kv_and_evict_releases_it(live_server):
    sid = _sid("evict")
    _chat(live_server, sid, _long_text(60, "ev"))
    info = _session(live_server, sid).json()
    assert info["state"] == "waiting" and info["num_requests"] == 1
    assert info["held_tokens"] >= 3 * BLOCK_SIZE
    assert info["tokens_per_tier"]["device"] == info["held_tokens"]
    cached = live_server.engine.stats().kv_blocks_cached
    edit = _manage(live_server, sid, [session_edit("evict")])["agent_hint_result"]["edits"][0]
    freed = -edit["tiers"]["device"]["blocks"]
    # blocks of the template's shared system prefix stay: other live sessions hold them too
    assert edit["action"] == "evicted" and 0 < freed <= info["held_tokens"] // BLOCK_SIZE
    assert edit["tiers"]["device"]["tokens"] == -freed * BLOCK_SIZE
    # released, not dropped: nobody holds them, so they go first, but a later prompt can still match them
    assert live_server.engine.stats().kv_blocks_cached == cached
    after = _session(live_server, sid).json()
    assert after["state"] == "ended" and after["held_tokens"] == 0
    _integrity(live_server)


def test_evicting_the_root_ends_its_sub_agents(live_server):
    root = _sid("root")
    child = sub_agent(root, "t1")
    sc = SessionClient(_client(live_server), live_server.engine.model_name)
    sc.chat(root, [{"role": "user", "content": "plan the work"}], max_tokens=2)
    sc.chat(child, [{"role": "user", "content": "do task one"}], max_tokens=2)
    assert _session(live_server, root).json()["children"] == [child.session_id]
    assert _session(live_server, child.session_id).json()["parent_session_id"] == root
    assert sc.release_tree(root).ok
    assert _session(live_server, root).json()["state"] == "ended"
    assert _session(live_server, child.session_id).json()["state"] == "ended"
    assert _session(live_server, child.session_id).json()["held_tokens"] == 0


def test_range_evict_drops_the_stale_tail_of_a_compressed_context(live_server):
    sid = _sid("range")
    old = [{"role": "system", "content": "You are terse."},
           {"role": "user", "content": _long_text(30, "q")},
           {"role": "assistant", "content": _long_text(30, "a")},
           {"role": "user", "content": _long_text(30, "r")}]
    sc = SessionClient(_client(live_server), live_server.engine.model_name)
    sc.chat(sid, old, max_tokens=2, temperature=0)
    held = _session(live_server, sid).json()["held_tokens"]
    res = sc.context_changed(sid, old, None, first_changed_message=2)
    assert res.ok, res.error
    [edit] = res.agent_hint_result["edits"]
    render = chat_render(live_server.engine.tokenizer, None)
    expected = stale_token_start(render, old, None, 2, None)
    assert (edit["action"], edit["token_start"]) == ("evicted", expected)
    kept = min(held, expected // BLOCK_SIZE * BLOCK_SIZE)
    assert 0 < kept < held
    assert _session(live_server, sid).json()["held_tokens"] == kept
    assert edit["tiers"]["device"]["blocks"] == -(held - kept) // BLOCK_SIZE
    _integrity(live_server)


def test_messages_and_tools_ranges_become_one_stale_range(live_server):
    sid = _sid("both")
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": _long_text(40, "m")}]
    body = _manage(live_server, sid, [messages_edit("evict", 1, 2), tools_edit("evict", 0, 1)],
                   messages=msgs, tools=[TOOL])
    first, second = body["agent_hint_result"]["edits"]
    expected = stale_token_start(chat_render(live_server.engine.tokenizer, None), msgs, [TOOL], 1, 0)
    assert first["token_start"] == second["token_start"] == expected
    assert second["tiers"] == {} and "applied together" in second["notes"][0]


def test_manage_request_false_generates_then_applies(live_server):
    sid = _sid("after")
    reply = _client(live_server).chat.completions.create(
        model=live_server.engine.model_name, messages=[{"role": "user", "content": "go on"}],
        max_tokens=3, temperature=0,
        extra_body=manage_hint(sid, None, [session_edit("evict")], manage_request=False))
    assert reply.usage.completion_tokens >= 1
    result = reply.model_extra["agent_hint_result"]
    assert result["manage_request"] is False and result["edits"][0]["action"] == "evicted"
    assert _session(live_server, sid).json()["state"] == "ended"


def test_streamed_request_applies_its_edits_after_the_last_chunk(live_server):
    sid = _sid("stream")
    stream = _client(live_server).chat.completions.create(
        model=live_server.engine.model_name, messages=[{"role": "user", "content": "stream"}],
        max_tokens=3, temperature=0, stream=True,
        extra_body=manage_hint(sid, None, [session_edit("offload")], manage_request=False))
    chunks = list(stream)
    last = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert last.model_extra["agent_hint_result"]["edits"][0]["action"] == "offloaded"
    assert _session(live_server, sid).json()["state"] == "suspended"


def test_session_control_alias_and_cache_control_ttl(live_server):
    sid = _sid("alias")
    _chat(live_server, sid, "alias", agent_hint={"session_id": sid, "parent_session_id": sid,
                                                  "cache_control": {"type": "ephemeral", "ttl": 600}})
    body = _manage(live_server, sid, [], agent_hint={"session_id": sid, "parent_session_id": sid,
                                                      "session_control": {"type": "pause"}})
    assert body["agent_hint_result"]["edits"][0]["action"] == "offloaded"
    assert _session(live_server, sid).json()["state"] == "suspended"


def test_get_session_shows_until_when_a_ttl_protects_it(live_server):
    """hard28: `GET /v1/sessions/{id}` did not show a session's protection; it now says how long a
    cache_control.ttl has left (`protect_left_s`) and until when on the wall clock (`protect_until`, Unix s)."""
    kept, plain = _sid("kept"), _sid("plain")
    before = time.time()
    _chat(live_server, kept, "keep me", agent_hint={"session_id": kept, "parent_session_id": kept,
                                                     "cache_control": {"type": "ephemeral", "ttl": "10m"}})
    _chat(live_server, plain, "not me")
    got = _session(live_server, kept).json()
    after = time.time()
    assert 0 < got["protect_left_s"] <= 600
    assert before < got["protect_until"] <= after + 600
    assert got["protect_until"] - got["protect_left_s"] <= after + 0.01  # (each rounded to ms)
    bare = _session(live_server, plain).json()
    assert bare["protect_left_s"] is None and bare["protect_until"] is None
    _manage(live_server, kept, [], agent_hint={"session_id": kept, "parent_session_id": kept,
                                               "session_control": {"type": "pause"}})
    paused = _session(live_server, kept).json()
    assert paused["protect_left_s"] is None and paused["protect_until"] is None, "a pause beats the ttl"


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_a_ttl_above_an_hour_is_served_with_a_note(live_server, stream):
    """review rev27 A6 b: a ttl above 3600 failed the whole inference; the spec asks the server to accept
    an engine-side extension and act where it makes sense: protected for 3600 s, said in the result."""
    sid = _sid(f"ttl-{stream}")
    out = _client(live_server).chat.completions.create(
        model=live_server.engine.model_name, messages=[{"role": "user", "content": "keep me warm"}], max_tokens=2,
        temperature=0, stream=stream, extra_body={"agent_hint": {
            "session_id": sid, "parent_session_id": sid, "cache_control": {"type": "ephemeral", "ttl": "2h"}}})
    last = next(c for c in out if c.choices and c.choices[0].finish_reason) if stream else out
    result = last.model_extra["agent_hint_result"]
    assert result["edits"] == []
    assert result["notes"] == ["cache_control.ttl 7200 s is above the 3600 s at most: the session is protected "
                               "for 3600 s"]
    got = _session(live_server, sid).json()
    assert 600 < got["protect_left_s"] <= 3600, "protected for the hour at most, not the 2 h asked"


def test_a_completion_with_a_prompt_and_an_alias_generates_then_applies_it(live_server):
    """A completion's prompt stands for chat's messages: with one, a session_control alias is served,
    then applied; without one it is a management request (review rev25 A8)."""
    sid = _sid("cmpl-alias")
    hinted = {"agent_hint": {"session_id": sid, "parent_session_id": sid, "session_control": {"type": "pause"}}}
    out = _client(live_server).completions.create(
        model=live_server.engine.model_name, prompt=list(range(7000, 7055)), max_tokens=3, temperature=0,
        extra_body={"ignore_eos": True, **hinted})
    assert out.usage.completion_tokens == 3
    assert out.model_extra["agent_hint_result"]["edits"][0]["action"] == "offloaded"
    assert _session(live_server, sid).json()["state"] == "suspended"
    r = httpx.post(live_server.v1 + "/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": live_server.engine.model_name, "prompt": "", **hinted}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 0, r.text


def test_header_identity_fallback(live_server):
    sid, parent = _sid("hdr"), _sid("hdr-root")
    headers = {"Authorization": f"Bearer {API_KEY}", "x-session-id": sid,
               "x-parent-session-id": parent}
    r = httpx.post(live_server.v1 + "/chat/completions", headers=headers, timeout=30, json={
        "model": live_server.engine.model_name, "max_tokens": 2,
        "messages": [{"role": "user", "content": "identity in headers"}]})
    assert r.status_code == 200, r.text
    info = _session(live_server, sid).json()
    assert info["parent_session_id"] == parent and info["held_tokens"] > 0
    r = httpx.post(live_server.v1 + "/chat/completions", headers=headers, timeout=30, json={
        "model": live_server.engine.model_name, "messages": [], "agent_hint": {
            "context_management": {"manage_request": True, "edits": [session_edit("evict")]}}})
    assert r.json()["agent_hint_result"]["edits"][0]["action"] == "evicted"
    assert _session(live_server, sid).json()["state"] == "ended"


def test_completions_accept_hints_with_token_prompts(live_server):
    sid = _sid("cmpl")
    client = _client(live_server)
    out = client.completions.create(model=live_server.engine.model_name, prompt=list(range(5, 60)),
                                    max_tokens=2, temperature=0, extra_body=hint(sid))
    assert out.choices[0].finish_reason in ("stop", "length")
    assert _session(live_server, sid).json()["held_tokens"] >= 3 * BLOCK_SIZE
    r = httpx.post(live_server.v1 + "/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": live_server.engine.model_name,
                         **manage_hint(sid, None, [session_edit("evict")])}, timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "" and body["choices"][0]["finish_reason"] == "stop"
    assert body["agent_hint_result"]["edits"][0]["action"] == "evicted"
    r = httpx.post(live_server.v1 + "/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"prompt": [1, 2, 3], **manage_hint(sid, None, [messages_edit("evict", 0, 1)])},
                   timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "agent_hint.context_management.edits[0].target"


def test_completions_tokens_range_evict_frees_exactly_the_stale_blocks(live_server):
    sid = _sid("tokrange")
    prompt = list(range(5, 5 + 6 * BLOCK_SIZE + 3))
    _client(live_server).completions.create(model=live_server.engine.model_name, prompt=prompt, max_tokens=2,
                                            temperature=0, extra_body=hint(sid))
    held = _session(live_server, sid).json()["held_tokens"]
    assert held >= 6 * BLOCK_SIZE
    start = 2 * BLOCK_SIZE + 5  # inside block 2: blocks 0-1 stay, block 2 on is stale
    r = httpx.post(live_server.v1 + "/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": live_server.engine.model_name,
                         **manage_hint(sid, None, [tokens_edit("evict", start, len(prompt) + 2)])}, timeout=30)
    assert r.status_code == 200, r.text
    [edit] = r.json()["agent_hint_result"]["edits"]
    assert (edit["action"], edit["token_start"]) == ("evicted", start)
    assert _session(live_server, sid).json()["held_tokens"] == 2 * BLOCK_SIZE
    assert edit["tiers"]["device"]["blocks"] == -(held - 2 * BLOCK_SIZE) // BLOCK_SIZE
    _integrity(live_server)
    r = httpx.post(live_server.v1 + "/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": live_server.engine.model_name, "messages": [],
                         **manage_hint(sid, None, [tokens_edit("evict", 0, 1)])}, timeout=30)
    assert r.status_code == 400  # a chat window names messages/tools, not token positions
    assert r.json()["error"]["param"] == "agent_hint.context_management.edits[0].target"


def test_async_session_client_suspend_chat_release(live_server):
    async def run() -> list:
        client = openai.AsyncOpenAI(base_url=live_server.v1, api_key=API_KEY, max_retries=0)
        sc = AsyncSessionClient(client, live_server.engine.model_name)
        sid = _sid("async")
        await sc.chat(sid, [{"role": "user", "content": "hi"}], max_tokens=2)
        out = [await sc.suspend(sid)]
        await sc.chat(sid, [{"role": "user", "content": "again"}], max_tokens=2)  # prefetches first
        out.append(await sc.release(sid))
        await client.close()
        return out

    suspended, released = asyncio.run(run())
    assert suspended.ok and released.ok
    assert released.agent_hint_result["edits"][0]["action"] == "evicted"


# ---- tenancy -------------------------------------------------------------------------------------

def _snapshot(live: LiveServer, sid: str, **who) -> dict:
    r = _session(live, sid, **who)
    assert r.status_code == 200
    return r.json()


@pytest.mark.parametrize("mine, theirs", [
    ({"key": API_KEY}, {"key": OTHER_API_KEY}),
    ({"key": API_KEY, "salt": "team-a"}, {"key": API_KEY, "salt": "team-b"}),
], ids=["two-keys", "two-salts"])
def test_one_tenant_cannot_see_or_touch_anothers_session(live_server, mine, theirs):
    sid = _sid("tenant")

    def body_extra(who: dict) -> dict:
        return {"cache_salt": who["salt"]} if "salt" in who else {}

    _chat(live_server, sid, _long_text(50, "mine"), key=mine["key"], **body_extra(mine))
    before = _snapshot(live_server, sid, **mine)
    cached = live_server.engine.stats().kv_blocks_cached
    assert _session(live_server, sid, **theirs).status_code == 404
    for action in ("offload", "prefetch", "evict"):
        body = _manage(live_server, sid, [session_edit(action)], key=theirs["key"],
                       **body_extra(theirs))
        assert body["agent_hint_result"]["edits"][0]["action"] == "none"
    assert _snapshot(live_server, sid, **mine) == before
    assert live_server.engine.stats().kv_blocks_cached == cached
    # the other tenant's own session of the same name is a different session
    _chat(live_server, sid, _long_text(50, "theirs"), key=theirs["key"], **body_extra(theirs))
    _manage(live_server, sid, [session_edit("evict")], key=theirs["key"], **body_extra(theirs))
    assert _snapshot(live_server, sid, **mine)["state"] == "waiting"
    assert _snapshot(live_server, sid, **mine)["held_tokens"] == before["held_tokens"]


def test_unknown_or_foreign_session_is_an_openai_404(live_server):
    r = _session(live_server, _sid("nobody"))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "session_not_found"
    assert httpx.get(f"{live_server.v1}/sessions/x", timeout=30).status_code == 401


# ---- bad hints -----------------------------------------------------------------------------------

CM = "agent_hint.context_management"
BAD_HINTS = [
    ({"session_id": "S", "parent_session_id": "S", "context_management": {
        "manage_request": True, "edits": [{"type": "evict", "target": "messages", "start": -1, "end": 1}]}},
     f"{CM}.edits[0].start"),
    ({"session_id": "S", "parent_session_id": "S", "context_management": {
        "manage_request": True, "edits": [{"type": "drop", "target": "session"}]}},
     f"{CM}.edits[0].type"),
    ({"session_id": "S", "parent_session_id": "S", "context_management": {
        "manage_request": True, "edits": [{"type": "evict", "target": "messages", "start": 0, "end": 5}]}},
     f"{CM}.edits[0].end"),
    ({"session_id": "S", "parent_session_id": "S", "context_management": {
        "manage_request": True, "edits": [{"type": "evict", "target": "session", "start": 0}]}},
     f"{CM}.edits[0].start"),
    ({"session_id": "S", "parent_session_id": "S", "context_management": {"edits": []}},
     f"{CM}.manage_request"),
    ({"session_id": "S"}, "agent_hint.parent_session_id"),
    ({"session_id": "S", "parent_session_id": "S", "cache_control": {"ttl": "1d"}},
     "agent_hint.cache_control.ttl"),
    ("not an object", "agent_hint"),
]


@pytest.mark.parametrize("bad, param", BAD_HINTS, ids=[p for _, p in BAD_HINTS])
def test_bad_hint_is_a_400_naming_the_field_and_changes_nothing(live_server, bad, param):
    sid = _sid("bad")
    _chat(live_server, sid, _long_text(30, "bad"))
    bad = json.loads(json.dumps(bad).replace('"S"', json.dumps(sid)))  # aim at this session
    before = (_snapshot(live_server, sid), live_server.engine.stats())
    r = httpx.post(live_server.v1 + "/chat/completions", timeout=30,
                   headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": live_server.engine.model_name, "max_tokens": 2,
                         "messages": [{"role": "user", "content": "x"}], "agent_hint": bad})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert (_snapshot(live_server, sid), live_server.engine.stats()) == before


# ---- --ignore-hints ------------------------------------------------------------------------------

def test_ignore_hints_validates_but_never_acts(ignoring_server):
    sid = _sid("ignored")
    _chat(ignoring_server, sid, "not attributed")
    assert _session(ignoring_server, sid).status_code == 404
    body = _manage(ignoring_server, sid, [session_edit("evict")])
    result = body["agent_hint_result"]
    assert result["notes"] == [IGNORED_NOTE]
    assert result["edits"][0]["action"] == "skipped" and result["edits"][0]["tiers"] == {}
    r = httpx.post(ignoring_server.v1 + "/chat/completions", timeout=30,
                   headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"messages": [], "agent_hint": {"session_id": sid}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "agent_hint.parent_session_id"


def test_hint_metrics_are_exported(live_server):
    _manage(live_server, _sid("metrics"), [session_edit("evict")])
    text = httpx.get(live_server.base_url + "/metrics", headers=live_server.headers, timeout=30).text
    assert 'hintkv_agent_hint_edits_total{action="none",target="session",type="evict"}' in text
    assert "hintkv_agent_hint_manage_seconds_count" in text


def test_a_hint_that_cannot_be_applied_is_reported_not_failed(live_server):
    sid = _sid("unrenderable")
    window = [{"role": "user", "content": "look"},
              {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    body = _manage(live_server, sid, [messages_edit("evict", 1, 2), session_edit("offload")],
                   messages=window)
    skipped, offload = body["agent_hint_result"]["edits"]
    assert skipped["action"] == "skipped" and "could not find the stale tokens" in skipped["notes"][0]
    assert offload["action"] == "none"  # the session is unknown: a successful no-op


def test_streamed_management_request_and_a_team_member_id_in_the_path(live_server):
    sid = f"team:{_sid('T')}:team:t:member:coder"
    _chat(live_server, sid, "member at work", parent="main-0")
    with httpx.stream("POST", live_server.v1 + "/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"model": live_server.engine.model_name, "messages": [], "stream": True,
                            **manage_hint(sid, "main-0", [session_edit("offload")])}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["agent_hint_result"]["edits"][0]["action"] == "offloaded"
    assert _session(live_server, sid).json()["state"] == "suspended"
