"""The router places a request by the session the instance attributes it to (review rev26 A7: a body's
null `session_id` with `x-session-id` headers was session s1 on the instance and no session at the router,
so every call was placed least-loaded, its KV spread over the instances; a blank header too). Both read
`hint_identity`."""

from __future__ import annotations

import pytest

from hintkv.protocol import parse_agent_hint
from hintkv.router.app import Identity

HEADERS = {"x-session-id": "s1", "x-parent-session-id": "lead"}
CASES = {
    "null session in body, header session": ({"agent_hint": {"session_id": None, "parent_session_id": None}},
                                             HEADERS),
    "empty hint, header session": ({"agent_hint": {}}, HEADERS),
    "no hint, header session": ({}, HEADERS),
    "body session wins over headers": ({"agent_hint": {"session_id": "b", "parent_session_id": "bp"}}, HEADERS),
    "blank header session": ({}, {"x-session-id": "  ", "x-parent-session-id": "lead"}),
    "header session alone": ({}, {"x-session-id": "s1"}),
    "no session anywhere": ({"model": "m"}, {}),
}


def _named(session: str | None, parent: str | None) -> Identity:
    """The placement of a request whose body names both ids outright (no header involved)."""
    return Identity({"agent_hint": {"session_id": session, "parent_session_id": parent}}, {})


@pytest.mark.parametrize("name", list(CASES))
def test_the_router_places_by_the_session_the_instance_reads(name):
    body, headers = CASES[name]
    hint = parse_agent_hint(body, headers, 1, 0)
    expected = _named(hint.session_id, hint.parent_session_id) if hint is not None else _named(None, None)
    who = Identity(body, headers)
    assert (who.key, who.parent_key, who.is_root) == (expected.key, expected.parent_key, expected.is_root)
