"""Build `agent_hint` bodies the way openJiuwen agent-core sends them, as OpenAI `extra_body` dicts.

    client.chat.completions.create(model=m, messages=msgs, extra_body=hint("sub-1", "main-0"))

Every builder returns plain JSON-ready dicts; the shapes are those of docs/protocol.md, and the
range checks mirror the server's so a bad edit fails here, before it is sent.
"""

from __future__ import annotations

EDIT_TYPES = ("evict", "offload", "prefetch")
RANGE_TARGETS = ("messages", "tools", "tokens")


def hint(session_id: str, parent_session_id: str | None = None, *, ttl: float | None = None) -> dict:
    """`extra_body` for an ordinary inference request of this session (a root if no parent)."""
    return {"agent_hint": _identity(session_id, parent_session_id, ttl)}


def manage_hint(
    session_id: str,
    parent_session_id: str | None,
    edits: list[dict],
    *,
    manage_request: bool = True,
    ttl: float | None = None,
) -> dict:
    """`extra_body` carrying edits: applied instead of generating (manage_request) or after it."""
    if not isinstance(manage_request, bool):
        raise ValueError("manage_request must be a bool")
    body = _identity(session_id, parent_session_id, ttl)
    body["context_management"] = {"manage_request": manage_request, "edits": list(edits)}
    return {"agent_hint": body}


def session_edit(action: str) -> dict:
    """An action on the whole session: evict, offload or prefetch."""
    _check_action(action)
    return {"type": action, "target": "session"}


def messages_edit(action: str, start: int, end: int) -> dict:
    """An action on messages [start, end) of the window sent with it."""
    return _range_edit(action, "messages", start, end)


def tools_edit(action: str, start: int, end: int) -> dict:
    """An action on tools [start, end) of the window sent with it."""
    return _range_edit(action, "tools", start, end)


def tokens_edit(action: str, start: int, end: int) -> dict:
    """An action on token positions [start, end) of the session's old window (our extension, for
    `/v1/completions`, whose prompt is token ids: from `start` on the context is stale)."""
    return _range_edit(action, "tokens", start, end)


def _range_edit(action: str, target: str, start: int, end: int) -> dict:
    _check_action(action)
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{target} {name} must be an integer, got {value!r}")
        if value < 0:
            raise ValueError(f"{target} {name} must be non-negative, got {value}")
    if start >= end:
        raise ValueError(f"{target} range must satisfy start < end, got [{start}, {end})")
    return {"type": action, "target": target, "start": start, "end": end}


def _identity(session_id: str, parent_session_id: str | None, ttl: float | None) -> dict:
    if not isinstance(session_id, str) or not session_id.strip():
        raise ValueError("session_id must be a non-empty string")
    body: dict = {"session_id": session_id, "parent_session_id": parent_session_id or session_id}
    if ttl is not None:
        body["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    return body


def _check_action(action: str) -> None:
    if action not in EDIT_TYPES:
        raise ValueError(f"edit type must be one of {EDIT_TYPES}, got {action!r}")
