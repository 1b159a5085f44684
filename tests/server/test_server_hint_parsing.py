"""From a request to a `RequestHint`: tenant, TTL, tool name, management flag, endpoint rules."""

from __future__ import annotations

import pytest

from hintkv.protocol import HintError
from hintkv.server.auth import tenant_of
from hintkv.server.hints import chat_hint, completion_hint, latest_tool_name

USER = [{"role": "user", "content": "hi"}]


def test_chat_hint_carries_tenant_ttl_and_management_flag():
    tenant = tenant_of("secret", "salt-1")
    raw = {"messages": [], "agent_hint": {
        "session_id": "s", "parent_session_id": "p", "cache_control": {"ttl": 120},
        "context_management": {"manage_request": True,
                               "edits": [{"type": "evict", "target": "session"}]}}}
    rh = chat_hint(raw, {}, [], None, tenant)
    assert rh.manage and [e.type for e in rh.edits] == ["evict"]
    assert (rh.ref.tenant, rh.ref.session_id, rh.ref.parent_session_id) == (tenant, "s", "p")
    assert rh.ref.ttl_s == 120 and rh.ref.tool is None


def test_a_ttl_above_an_hour_protects_the_session_for_an_hour():
    raw = {"messages": USER, "agent_hint": {"session_id": "s", "parent_session_id": "s",
                                            "cache_control": {"ttl": 86400}}}
    rh = chat_hint(raw, {}, USER, None, "t")
    assert rh.ref.ttl_s == 3600 and rh.hint.cache_control.ttl == 86400 and not rh.manage


def test_no_hint_is_none_and_headers_are_a_fallback():
    assert chat_hint({"messages": USER}, {}, USER, None, "t") is None
    rh = chat_hint({"messages": USER}, {"x-session-id": "h", "x-parent-session-id": "hp"}, USER,
                   None, "t")
    assert (rh.ref.session_id, rh.ref.parent_session_id, rh.manage) == ("h", "hp", False)


def test_completion_hint_refuses_ranges_and_names_the_target():
    raw = {"agent_hint": {"session_id": "s", "parent_session_id": "s", "context_management": {
        "manage_request": True, "edits": [{"type": "evict", "target": "session"},
                                          {"type": "evict", "target": "tools", "start": 0, "end": 1}]}}}
    with pytest.raises(HintError) as err:
        completion_hint(raw, {}, "t")
    assert err.value.param == "agent_hint.context_management.edits[1].target"
    alias = {"agent_hint": {"session_id": "s", "parent_session_id": "s",
                            "session_control": {"type": "stop"}}}
    assert completion_hint(alias, {}, "t").manage  # nothing to generate from: a management request


@pytest.mark.parametrize("messages, expected", [
    (USER, None),
    ([*USER, {"role": "tool", "name": "grep", "content": "r"}], "grep"),
    ([*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "a"},
      {"role": "tool", "tool_call_id": "c2", "content": "b"},
      {"role": "user", "content": "next"}], "cat"),
    ([*USER, {"role": "tool", "tool_call_id": "missing", "content": "a"}], None),
])
def test_latest_tool_name(messages, expected):
    assert latest_tool_name(messages) == expected
