"""Hint builders and session identities produce exactly the wire shapes of docs/protocol.md."""

from __future__ import annotations

import pytest

from hintkv.client import (
    Session,
    compressor,
    compressor_id,
    hint,
    manage_hint,
    messages_edit,
    session_edit,
    sub_agent,
    sub_agent_id,
    team_member,
    team_member_id,
    tools_edit,
)
from hintkv.protocol import parse_agent_hint, resolved_edits


def test_hint_for_ordinary_requests():
    assert hint("sub-1", "main-0") == {"agent_hint": {"session_id": "sub-1", "parent_session_id": "main-0"}}
    assert hint("main-0") == {"agent_hint": {"session_id": "main-0", "parent_session_id": "main-0"}}
    assert hint("s", "p", ttl=600) == {"agent_hint": {
        "session_id": "s", "parent_session_id": "p", "cache_control": {"type": "ephemeral", "ttl": 600}}}


def test_manage_hint_and_edits():
    body = manage_hint("sub-1", "main-0", [session_edit("offload")])
    assert body == {"agent_hint": {"session_id": "sub-1", "parent_session_id": "main-0", "context_management": {
        "manage_request": True, "edits": [{"type": "offload", "target": "session"}]}}}
    body = manage_hint("s", None, [messages_edit("evict", 2, 5), tools_edit("evict", 0, 3)], manage_request=False)
    assert body["agent_hint"]["parent_session_id"] == "s"
    assert body["agent_hint"]["context_management"] == {"manage_request": False, "edits": [
        {"type": "evict", "target": "messages", "start": 2, "end": 5},
        {"type": "evict", "target": "tools", "start": 0, "end": 3}]}
    parsed = parse_agent_hint(body, {}, 5, 3)  # what the builders make, the server accepts
    assert [(e.type, e.target, e.start, e.end) for e in resolved_edits(parsed)] == [
        ("evict", "messages", 2, 5), ("evict", "tools", 0, 3)]


@pytest.mark.parametrize("build", [
    lambda: session_edit("drop"),
    lambda: messages_edit("evict", 3, 3),
    lambda: messages_edit("evict", -1, 2),
    lambda: tools_edit("evict", True, 2),
    lambda: tools_edit("evict", 0, 1.5),
    lambda: messages_edit("remove", 0, 1),
    lambda: hint(""),
    lambda: manage_hint("s", "p", [], manage_request="yes"),
])
def test_builders_refuse_what_the_server_would_refuse(build):
    with pytest.raises(ValueError):
        build()


def test_identity_patterns():
    assert team_member_id("T1", "t", "coder") == "team:T1:team:t:member:coder"
    assert compressor_id("main-0", "round-level") == "main-0:compressor:round-level"
    assert sub_agent_id("main-0", "t1") == "main-0_sub_t1"
    assert team_member("T1", "t", "coder") == Session("team:T1:team:t:member:coder", "T1")
    assert team_member("T1", "t", "coder", parent="main-0").parent == "main-0"
    assert compressor("main-0", "dialogue") == Session("main-0:compressor:dialogue", "main-0")
    assert sub_agent("main-0", "t1") == Session("main-0_sub_t1", "main-0")
    with pytest.raises(ValueError):
        compressor_id("main-0", "weekly")
    with pytest.raises(ValueError):
        sub_agent_id("", "t1")


def test_session_parent_defaults_to_itself():
    root = Session("main-0")
    assert root.parent == "main-0" and root.is_root
    child = Session("sub-1", "main-0")
    assert child.parent == "main-0" and not child.is_root
    for bad in ({"session_id": ""}, {"session_id": "s", "parent_session_id": " "}, {"session_id": 3}):
        with pytest.raises(ValueError):
            Session(**bad)
