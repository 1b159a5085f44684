"""From a request's `agent_hint` (body or headers) to what the server acts on: a `RequestHint`.

The protocol layer (hintkv.protocol) parses and validates the hint; this module adds what only
the server knows: the tenant (API key identity + cache_salt, see `auth.tenant_of`), the tool
whose result the request carries, and whether the request is a management request. A malformed
hint raises `HintError`, which the routes turn into a 400 before anything is changed.

    /v1/chat/completions   ranges index the request's own `messages` / `tools`
    /v1/completions        a prompt has no messages or tools: range edits are a 400
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hintkv.engine.types import SessionRef
from hintkv.protocol import (
    AgentHint,
    Edit,
    HintError,
    is_management_request,
    parse_agent_hint,
    resolved_edits,
)

# Range edits are refused on /v1/completions, so no size bounds them at parse time.
_UNBOUNDED = 2**62


@dataclass(slots=True)
class RequestHint:
    """A validated hint of one request, with the session it names inside the caller's tenant."""

    hint: AgentHint
    ref: SessionRef
    edits: list[Edit]  # resolved: context_management edits, then the session_control alias
    manage: bool  # a management request: apply the edits, generate nothing


def chat_hint(
    raw: Mapping[str, Any],
    headers: Mapping[str, str],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    tenant: str,
) -> RequestHint | None:
    """The hint of a chat request (None if it has none); raises `HintError` if malformed."""
    hint = parse_agent_hint(raw, headers, len(messages), len(tools or []))
    if hint is None:
        return None
    ref = session_ref(hint, tenant, latest_tool_name(messages))
    return RequestHint(hint, ref, resolved_edits(hint), is_management_request(hint, len(messages)))


def completion_hint(
    raw: Mapping[str, Any], headers: Mapping[str, str], tenant: str
) -> RequestHint | None:
    """The hint of a /v1/completions request; a messages/tools range edit is a `HintError` (a
    `tokens` range names token positions of the session's old window instead)."""
    hint = parse_agent_hint(raw, headers, _UNBOUNDED, _UNBOUNDED, num_tokens=_UNBOUNDED)
    if hint is None:
        return None
    edits = hint.context_management.edits if hint.context_management is not None else []
    for index, edit in enumerate(edits):
        if edit.is_range and edit.target != "tokens":
            raise HintError(
                f"target {edit.target!r} needs the request's messages/tools: send it to "
                "/v1/chat/completions (a completion prompt has neither)",
                f"agent_hint.context_management.edits[{index}].target",
            )
    # A completion's prompt stands for the messages: a session_control alias with no prompt is a
    # management request; with one it is served, then applied (as chat's with messages).
    prompt = raw.get("prompt")
    has_prompt = prompt not in (None, "", []) and prompt != [[]] and prompt != [""]
    return RequestHint(
        hint, session_ref(hint, tenant, None), resolved_edits(hint), is_management_request(hint, int(has_prompt))
    )


def session_ref(hint: AgentHint, tenant: str, tool: str | None) -> SessionRef:
    ttl = hint.cache_control.protect_s if hint.cache_control is not None else None
    return SessionRef(tenant, hint.session_id, hint.parent_session_id, ttl_s=ttl, tool=tool)


def latest_tool_name(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The function name of the latest tool result in `messages`, if any.

    A `tool` message names its function itself (`name`), or only points at the assistant's
    call by `tool_call_id`; then the name is found on that call.
    """
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.get("role") != "tool":
            continue
        if isinstance(msg.get("name"), str) and msg["name"]:
            return msg["name"]
        return _called_function(messages[:i], msg.get("tool_call_id"))
    return None


def _called_function(earlier: Sequence[Mapping[str, Any]], call_id: Any) -> str | None:
    if not isinstance(call_id, str):
        return None
    for msg in reversed(earlier):
        calls = msg.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, Mapping) and call.get("id") == call_id:
                fn = call.get("function")
                name = fn.get("name") if isinstance(fn, Mapping) else None
                return name if isinstance(name, str) and name else None
    return None
