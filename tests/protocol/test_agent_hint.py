"""parse_agent_hint on every request shape agent-core sends, and on every malformed one."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from hintkv.protocol import (
    AgentHint,
    Edit,
    HintError,
    is_management_request,
    parse_agent_hint,
    resolved_edits,
)

TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}

# Request bodies as openJiuwen agent-core's OpenAI client builds them (extra_body merged into
# the top level; a whole-session management request has messages [] and no tools/max_tokens).
# "$TOOL" stands for one tool definition. Each entry: (body JSON, expected resolved edits).
EXAMPLES = {
    "inference_team_member": ("""
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [$TOOL],
         "tool_choice": "auto", "stream": true,
         "agent_hint": {"session_id": "team:T1:team:t:member:coder", "parent_session_id": "main-0"}}
        """, []),
    "inference_root": ("""
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": false,
         "agent_hint": {"session_id": "main-0", "parent_session_id": "main-0"}}
        """, []),
    "offload_session": ("""
        {"model": "m", "messages": [], "agent_hint": {
          "session_id": "sub-1", "parent_session_id": "main-0",
          "context_management": {"manage_request": true,
             "edits": [{"type": "offload", "target": "session"}]}}}
        """, [("offload", "session", None, None)]),
    "prefetch_session": ("""
        {"model": "m", "messages": [], "stream": false, "agent_hint": {
          "session_id": "main-0_sub_t1", "parent_session_id": "main-0",
          "context_management": {"manage_request": true,
             "edits": [{"type": "prefetch", "target": "session"}]}}}
        """, [("prefetch", "session", None, None)]),
    "evict_session": ("""
        {"model": "m", "messages": [], "stream": false, "temperature": 0.7, "agent_hint": {
          "session_id": "main-0:compressor:dialogue", "parent_session_id": "main-0",
          "context_management": {"manage_request": true,
             "edits": [{"type": "evict", "target": "session"}]}}}
        """, [("evict", "session", None, None)]),
    "evict_root_tree": ("""
        {"model": "m", "messages": [], "stream": false, "agent_hint": {
          "session_id": "main-0", "parent_session_id": "main-0",
          "context_management": {"manage_request": true,
             "edits": [{"type": "evict", "target": "session"}]}}}
        """, [("evict", "session", None, None)]),
    "evict_messages_range": ("""
        {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                                    {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
         "stream": false, "tools": [$TOOL], "tool_choice": "auto",
         "agent_hint": {"session_id": "s1", "parent_session_id": "s1",
           "context_management": {"manage_request": true,
             "edits": [{"type": "evict", "target": "messages", "start": 1, "end": 4}]}}}
        """, [("evict", "messages", 1, 4)]),
    "evict_messages_and_tools": ("""
        {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}],
         "stream": false, "tools": [$TOOL, $TOOL], "tool_choice": "auto",
         "agent_hint": {"session_id": "s1", "parent_session_id": "p",
           "context_management": {"manage_request": true, "edits": [
             {"type": "evict", "target": "messages", "start": 1, "end": 2},
             {"type": "evict", "target": "tools", "start": 1, "end": 2}]}}}
        """, [("evict", "messages", 1, 2), ("evict", "tools", 1, 2)]),
    "evict_tools_only": ("""
        {"model": "m", "messages": [{"role": "user", "content": "a"}], "stream": false,
         "tools": [$TOOL], "tool_choice": "auto",
         "agent_hint": {"session_id": "s1", "parent_session_id": "p",
           "context_management": {"manage_request": true,
             "edits": [{"type": "evict", "target": "tools", "start": 0, "end": 1}]}}}
        """, [("evict", "tools", 0, 1)]),
    "infer_then_offload": ("""
        {"model": "m", "messages": [{"role": "user", "content": "a"}], "max_tokens": 16,
         "agent_hint": {"session_id": "s1", "parent_session_id": "p",
           "context_management": {"manage_request": false,
             "edits": [{"type": "offload", "target": "session"}]}}}
        """, [("offload", "session", None, None)]),
    "extension_fields_alongside": ("""
        {"model": "m", "messages": [{"role": "user", "content": "a"}], "cache_salt": "tenant-7",
         "cache_sharing": true, "return_token_ids": true, "enable_thinking": false,
         "thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": false},
         "agent_hint": {"session_id": "s1", "parent_session_id": "p"}}
        """, []),
    "engine_extensions": ("""
        {"model": "m", "messages": [], "agent_hint": {"session_id": "s1", "parent_session_id": "p",
          "cache_control": {"type": "ephemeral", "ttl": 600}, "session_control": {"type": "pause"}}}
        """, [("offload", "session", None, None)]),
    "server_internal_and_unknown_fields": ("""
        {"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
         "agent_hint": {"session_id": "s1", "parent_session_id": "p", "trace": "x",
           "context_management": {"manage_request": true, "future": 1, "edits": [
             {"type": "offload", "target": "messages", "start": 0, "end": 2,
              "block_start": 0, "block_end": 99, "why": "compress"}]}}}
        """, [("offload", "messages", 0, 2)]),
}


def _example_body(name: str) -> dict:
    return json.loads(EXAMPLES[name][0].replace("$TOOL", json.dumps(TOOL)))


def _parse(body: dict, headers: dict | None = None) -> AgentHint | None:
    return parse_agent_hint(body, headers or {}, len(body.get("messages") or []), len(body.get("tools") or []))


def _as_tuples(edits: list[Edit]) -> list[tuple]:
    return [(e.type, e.target, e.start, e.end) for e in edits]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_body_parses(name):
    body = _example_body(name)
    expected_edits = EXAMPLES[name][1]
    hint = _parse(body)
    assert hint.session_id == body["agent_hint"]["session_id"]
    assert hint.parent_session_id == body["agent_hint"]["parent_session_id"]
    assert _as_tuples(resolved_edits(hint)) == expected_edits


def test_manage_request_and_extensions_are_kept():
    offload = _parse(_example_body("offload_session"))
    assert offload.manage_request and is_management_request(offload, 0)
    infer = _parse(_example_body("infer_then_offload"))
    assert not infer.manage_request and not is_management_request(infer, 1)
    ext = _parse(_example_body("engine_extensions"))
    assert ext.cache_control.ttl == 600 and ext.cache_control.type == "ephemeral"
    assert is_management_request(ext, 0)  # a session_control alias with nothing to generate from
    assert not is_management_request(ext, 1)


def test_no_hint_and_no_headers_is_none():
    assert _parse({"model": "m", "messages": [{"role": "user", "content": "a"}]}) is None
    assert _parse({"model": "m", "messages": [], "agent_hint": None}) is None
    assert _parse({"model": "m", "messages": []}, {"x-parent-session-id": "p"}) is None
    assert _parse({"model": "m", "messages": []}, {"x-session-id": "  "}) is None


def test_header_fallback():
    body = {"model": "m", "messages": [{"role": "user", "content": "a"}]}
    hint = _parse(body, {"X-Session-Id": "h1", "X-Parent-Session-Id": "hp"})
    assert (hint.session_id, hint.parent_session_id) == ("h1", "hp")
    # the body's identity wins over headers
    body["agent_hint"] = {"session_id": "b1", "parent_session_id": "bp"}
    hint = _parse(body, {"x-session-id": "h1", "x-parent-session-id": "hp"})
    assert (hint.session_id, hint.parent_session_id) == ("b1", "bp")
    # edits in the body, identity from headers
    body["agent_hint"] = {"context_management": {"manage_request": True,
                                                 "edits": [{"type": "prefetch", "target": "session"}]}}
    hint = _parse(body, {"x-session-id": "h1", "x-parent-session-id": "hp"})
    assert (hint.session_id, hint.parent_session_id) == ("h1", "hp")
    assert _as_tuples(resolved_edits(hint)) == [("prefetch", "session", None, None)]
    # a parent in the body completes a header session
    body["agent_hint"] = {"parent_session_id": "bp"}
    assert _parse(body, {"x-session-id": "h1"}).parent_session_id == "bp"


@pytest.mark.parametrize(
    "control, expected",
    [("start", []), ("pause", [("offload", "session", None, None)]),
     ("resume", [("prefetch", "session", None, None)]), ("stop", [("evict", "session", None, None)]),
     ("compact", [("evict", "session", None, None)])],
)
def test_session_control_aliases(control, expected):
    hint = _parse({"messages": [], "agent_hint": {"session_id": "s", "parent_session_id": "p",
                                                  "session_control": {"type": control}}})
    assert _as_tuples(resolved_edits(hint)) == expected


def test_alias_comes_after_context_management_edits():
    hint = _parse({"messages": [{"role": "user", "content": "a"}], "agent_hint": {
        "session_id": "s", "parent_session_id": "p", "session_control": {"type": "stop"},
        "context_management": {"manage_request": True,
                               "edits": [{"type": "offload", "target": "messages", "start": 0, "end": 1}]}}})
    assert _as_tuples(resolved_edits(hint)) == [("offload", "messages", 0, 1), ("evict", "session", None, None)]


def test_cache_control_defaults_and_bounds():
    hint = _parse({"messages": [], "agent_hint": {"session_id": "s", "parent_session_id": "p", "cache_control": {}}})
    assert hint.cache_control.ttl == 300 and hint.cache_control.type == "ephemeral"
    hint = _parse({"messages": [], "agent_hint": {"session_id": "s", "parent_session_id": "p",
                                                  "cache_control": {"type": "ephemeral", "ttl": 3600}}})
    assert hint.cache_control.ttl == 3600 and hint.cache_control.protect_s == 3600 and hint.notes == []


@pytest.mark.parametrize("ttl, asked, note", [
    (3601, 3601, True), (86400, 86400, True), ("5m", 300, False), ("1h", 3600, False), ("30s", 30, False),
    ("2h", 7200, True),
])
def test_a_longer_or_anthropic_ttl_is_accepted_and_protects_at_most_an_hour(ttl, asked, note):
    """The spec's section 4 takes the engine-side extensions as "accept them; act where it makes sense":
    a ttl above 3600 protects for 3600, with a note, instead of failing the inference (review rev27 A6 b);
    Anthropic's cache_control writes a ttl as "5m" / "1h"."""
    hint = _parse({"messages": [], "agent_hint": {"session_id": "s", "parent_session_id": "s",
                                                  "cache_control": {"type": "ephemeral", "ttl": ttl}}})
    assert (hint.cache_control.ttl, hint.cache_control.protect_s) == (asked, min(asked, 3600))
    assert hint.notes == ([f"cache_control.ttl {asked} s is above the 3600 s at most: the session is protected "
                           "for 3600 s"] if note else [])


CM = "agent_hint.context_management"


def _cm(*edits, manage_request=True) -> dict:
    return {"manage_request": manage_request, "edits": list(edits)}


def _hint(**fields) -> dict:
    return {"session_id": "s", "parent_session_id": "p", **fields}


# (agent_hint, num_messages, num_tools, param)
MALFORMED = [
    ("not an object", 0, 0, "agent_hint"),
    ({"parent_session_id": "p"}, 0, 0, "agent_hint.session_id"),
    ({"session_id": "s"}, 0, 0, "agent_hint.parent_session_id"),
    ({"session_id": "", "parent_session_id": "p"}, 0, 0, "agent_hint.session_id"),
    ({"session_id": "s", "parent_session_id": "  "}, 0, 0, "agent_hint.parent_session_id"),
    ({"session_id": 7, "parent_session_id": "p"}, 0, 0, "agent_hint.session_id"),
    ({"session_id": "s", "parent_session_id": ["p"]}, 0, 0, "agent_hint.parent_session_id"),
    (_hint(context_management="x"), 0, 0, CM),
    (_hint(context_management={"edits": []}), 0, 0, f"{CM}.manage_request"),
    (_hint(context_management={"manage_request": "true", "edits": []}), 0, 0, f"{CM}.manage_request"),
    (_hint(context_management={"manage_request": 1, "edits": []}), 0, 0, f"{CM}.manage_request"),
    (_hint(context_management={"manage_request": True, "edits": {"type": "evict"}}), 0, 0, f"{CM}.edits"),
    (_hint(context_management=_cm("evict")), 0, 0, f"{CM}.edits[0]"),
    (_hint(context_management=_cm({"target": "session"})), 0, 0, f"{CM}.edits[0].type"),
    (_hint(context_management=_cm({"type": "delete", "target": "session"})), 0, 0, f"{CM}.edits[0].type"),
    (_hint(context_management=_cm({"type": "evict"})), 0, 0, f"{CM}.edits[0].target"),
    (_hint(context_management=_cm({"type": "evict", "target": "kv"})), 0, 0, f"{CM}.edits[0].target"),
    (_hint(context_management=_cm({"type": "evict", "target": "session", "start": 0, "end": 1})), 1, 0,
     f"{CM}.edits[0].start"),
    (_hint(context_management=_cm({"type": "evict", "target": "session", "end": 1})), 1, 0, f"{CM}.edits[0].end"),
    (_hint(context_management=_cm({"type": "evict", "target": "messages", "end": 1})), 1, 0,
     f"{CM}.edits[0].start"),
    (_hint(context_management=_cm({"type": "evict", "target": "tools", "start": 0})), 0, 1, f"{CM}.edits[0].end"),
    (_hint(context_management=_cm({"type": "evict", "target": "messages", "start": 2, "end": 2})), 3, 0,
     f"{CM}.edits[0].start"),
    (_hint(context_management=_cm({"type": "evict", "target": "messages", "start": 3, "end": 2})), 3, 0,
     f"{CM}.edits[0].start"),
    (_hint(context_management=_cm({"type": "evict", "target": "messages", "start": -1, "end": 2})), 3, 0,
     f"{CM}.edits[0].start"),
    (_hint(context_management=_cm({"type": "evict", "target": "messages", "start": True, "end": 2})), 3, 0,
     f"{CM}.edits[0].start"),
    (_hint(context_management=_cm({"type": "evict", "target": "messages", "start": 0, "end": 1.5})), 3, 0,
     f"{CM}.edits[0].end"),
    (_hint(context_management=_cm({"type": "evict", "target": "messages", "start": 0, "end": 2.0})), 3, 0,
     f"{CM}.edits[0].end"),
    (_hint(context_management=_cm({"type": "evict", "target": "messages", "start": "0", "end": 2})), 3, 0,
     f"{CM}.edits[0].start"),
    (_hint(context_management=_cm({"type": "evict", "target": "messages", "start": 0, "end": 4})), 3, 0,
     f"{CM}.edits[0].end"),
    (_hint(context_management=_cm({"type": "evict", "target": "tools", "start": 0, "end": 1})), 3, 0,
     f"{CM}.edits[0].end"),
    (_hint(context_management=_cm({"type": "evict", "target": "session"},
                                  {"type": "offload", "target": "tools", "start": 1, "end": 3})), 0, 2,
     f"{CM}.edits[1].end"),
    (_hint(cache_control={"type": "persistent"}), 0, 0, "agent_hint.cache_control.type"),
    (_hint(cache_control={"ttl": "5 minutes"}), 0, 0, "agent_hint.cache_control.ttl"),
    (_hint(cache_control={"ttl": "0m"}), 0, 0, "agent_hint.cache_control.ttl"),
    (_hint(cache_control={"ttl": "-1h"}), 0, 0, "agent_hint.cache_control.ttl"),
    (_hint(cache_control={"ttl": "300"}), 0, 0, "agent_hint.cache_control.ttl"),
    (_hint(cache_control={"ttl": 0}), 0, 0, "agent_hint.cache_control.ttl"),
    (_hint(cache_control={"ttl": True}), 0, 0, "agent_hint.cache_control.ttl"),
    (_hint(cache_control="ephemeral"), 0, 0, "agent_hint.cache_control"),
    (_hint(session_control={"type": "suspend"}), 0, 0, "agent_hint.session_control.type"),
    (_hint(session_control={}), 0, 0, "agent_hint.session_control.type"),
]


@pytest.mark.parametrize("agent_hint, num_messages, num_tools, param", MALFORMED)
def test_malformed_hint_names_the_field(agent_hint, num_messages, num_tools, param):
    with pytest.raises(HintError) as info:
        parse_agent_hint({"model": "m", "agent_hint": agent_hint}, {}, num_messages, num_tools)
    assert info.value.param == param
    assert info.value.as_error_body() == {
        "error": {"message": info.value.message, "type": "invalid_request_error", "param": param}}


def test_a_header_session_without_its_parent_is_a_root_session():
    """A gateway that sends `x-session-id` alone (a root session's parent is itself) is served, not a 400 on
    every call (review rev27 A5); a body hint still names its parent."""
    body = {"model": "m", "messages": []}
    hint = parse_agent_hint(body, {"x-session-id": "h1"}, 0, 0)
    assert (hint.session_id, hint.parent_session_id) == ("h1", "h1")
    hint = parse_agent_hint({**body, "agent_hint": {"cache_control": {}}}, {"x-session-id": "h1"}, 0, 0)
    assert (hint.session_id, hint.parent_session_id) == ("h1", "h1")
    with pytest.raises(HintError) as info:
        parse_agent_hint({**body, "agent_hint": {"session_id": "b1"}}, {}, 0, 0)
    assert info.value.param == "agent_hint.parent_session_id"
    body["agent_hint"] = {}
    with pytest.raises(HintError) as info:
        parse_agent_hint(body, {}, 0, 0)
    assert info.value.param == "agent_hint.session_id"


def test_edit_checks_its_own_range_when_built_directly():
    assert Edit(type="evict", target="messages", start=0, end=1).is_range
    for bad in ({"target": "messages", "start": 2, "end": 1}, {"target": "session", "start": 0},
                {"target": "tools", "start": 0}):
        with pytest.raises(ValidationError):
            Edit(type="evict", **bad)
