"""The Agent Hint: types of the `agent_hint` request field and the one function that parses it.

An agent framework (openJiuwen agent-core today) puts `agent_hint` at the top level of an OpenAI
chat-completions body to tell the server which agent context a prompt belongs to and what to do
with that context's KV cache. The wire format is fixed by that client and written down in
docs/protocol.md; this module accepts all of it and rejects what is malformed with a
`HintError` naming the exact field:

    {"session_id": "sub-1", "parent_session_id": "main-0",
     "context_management": {"manage_request": true,
                            "edits": [{"type": "evict", "target": "messages", "start": 3, "end": 9}]},
     "cache_control": {"type": "ephemeral", "ttl": 300},   # engine-side extension
     "session_control": {"type": "pause"}}                 # gateway alias of an edit

Invariants of a parsed hint (checked here, relied on downstream):
- both ids are non-empty strings;
- a `session` edit has no range; a `messages`/`tools` edit has integers 0 <= start < end <= the
  number of messages/tools sent in that same request; a `tokens` edit (our extension, for
  `/v1/completions`, whose prompt is token ids) has 0 <= start < end: token positions of the
  session's old window, from `start` on stale;
- unknown fields anywhere are accepted and dropped, and so are an edit's server-internal
  `block_start`/`block_end`.

Use: `hint = parse_agent_hint(body, request.headers, len(messages), len(tools or []))`, then
`resolved_edits(hint)` for the list of actions to apply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hintkv.protocol.errors import HintError

EditType = Literal["evict", "offload", "prefetch"]
EditTarget = Literal["session", "messages", "tools", "tokens"]
SessionControlType = Literal["start", "pause", "resume", "stop", "compact"]

DEFAULT_TTL_S = 300.0
MAX_TTL_S = 3600.0  # a longer ttl is served, protected this long (CacheControl.protect_s)
_DURATION_UNIT_S = {"s": 1, "m": 60, "h": 3600}
MAX_ID_CHARS = 256  # session ids: long enough for any UUID-based scheme, short enough to log
MAX_EDITS = 64  # edits per request: a request's lock hold stays in milliseconds

SESSION_HEADER = "x-session-id"
PARENT_SESSION_HEADER = "x-parent-session-id"

# session_control is a gateway alias: each type stands for one whole-session edit (or none).
SESSION_CONTROL_EDIT_TYPES: dict[str, EditType | None] = {
    "start": None,
    "pause": "offload",
    "resume": "prefetch",
    "stop": "evict",
    "compact": "evict",
}


class _FieldError(ValueError):
    """A cross-field rule broken by one named field, so the error can point at that field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class _HintModel(BaseModel):
    # strict: a bool is not an int, 1.5 is not an int, "1" is not an int; extra fields are dropped.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class Edit(_HintModel):
    """One action on a session's KV: the whole session, or a half-open range of messages/tools."""

    type: EditType
    target: EditTarget
    start: int | None = None  # index of the first changed item in the list sent (ranges only)
    end: int | None = None  # one past the last item (ranges only; the client sends the old end)

    @model_validator(mode="after")
    def _check_range(self) -> Edit:
        if self.target == "session":
            if self.start is not None or self.end is not None:
                raise _FieldError("start" if self.start is not None else "end", "target 'session' takes no range")
            return self
        for name in ("start", "end"):
            value = getattr(self, name)
            if value is None:
                raise _FieldError(name, f"target {self.target!r} requires both start and end")
            if value < 0:
                raise _FieldError(name, f"{name} must be non-negative, got {value}")
        if self.start >= self.end:
            raise _FieldError("start", f"half-open range requires start < end, got [{self.start}, {self.end})")
        return self

    @property
    def is_range(self) -> bool:
        return self.target != "session"


class ContextManagement(_HintModel):
    """Edits to apply; `manage_request` true means apply them and do not generate."""

    manage_request: bool
    edits: list[Edit] = Field(default_factory=list, max_length=MAX_EDITS)


class CacheControl(_HintModel):
    """Keep this session's KV warm for `ttl` seconds: a soft protection, never a hard lock.

    `ttl` is seconds, or a duration as Anthropic's cache_control writes it ("5m", "1h"; also "30s").
    More than MAX_TTL_S is served, protected for MAX_TTL_S, with a note (the spec's section 4: an
    engine-side extension is accepted, acted on where it makes sense; review rev27 A6 b)."""

    type: Literal["ephemeral"] = "ephemeral"
    ttl: float = Field(default=DEFAULT_TTL_S, gt=0)  # as asked; `protect_s` is what the server grants

    @field_validator("ttl", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        match = re.fullmatch(r"([0-9]{1,9})([smh])", value)
        if match is None:
            raise ValueError(f"must be a number of seconds or a duration such as '5m' or '1h', got {value[:40]!r}")
        return float(int(match[1]) * _DURATION_UNIT_S[match[2]])

    @property
    def protect_s(self) -> float:
        return min(self.ttl, MAX_TTL_S)

    @property
    def note(self) -> str | None:
        if self.ttl <= MAX_TTL_S:
            return None
        return (f"cache_control.ttl {self.ttl:g} s is above the {MAX_TTL_S:g} s at most: "
                f"the session is protected for {MAX_TTL_S:g} s")


class SessionControl(_HintModel):
    """Gateway alias for a whole-session edit (see SESSION_CONTROL_EDIT_TYPES)."""

    type: SessionControlType

    def edits(self) -> list[Edit]:
        edit_type = SESSION_CONTROL_EDIT_TYPES[self.type]
        if edit_type is None:
            return []
        return [(CompactEdit if self.type == "compact" else Edit)(type=edit_type, target="session")]


class CompactEdit(Edit):
    """`session_control: compact`'s evict: the session's own context is stale (the agent compacted
    it), so its claim on its KV goes, but the session goes on and its sub-agents are not ended (a
    root's plain evict, `stop`, ends its whole tree). Made only by the alias, never from the wire."""


class AgentHint(_HintModel):
    """Who a request belongs to (`session_id` under `parent_session_id`) and what to do with its KV."""

    session_id: str = Field(max_length=MAX_ID_CHARS)
    parent_session_id: str = Field(max_length=MAX_ID_CHARS)  # a root session sends its own id
    context_management: ContextManagement | None = None
    cache_control: CacheControl | None = None
    session_control: SessionControl | None = None

    @field_validator("session_id", "parent_session_id")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a non-empty string")
        return value

    @property
    def manage_request(self) -> bool:
        """True when the request asks for its edits only, with no generation."""
        return self.context_management is not None and self.context_management.manage_request

    @property
    def notes(self) -> list[str]:
        """What the server changed in an accepted hint (a ttl above MAX_TTL_S), for its `agent_hint_result`."""
        note = self.cache_control.note if self.cache_control is not None else None
        return [note] if note is not None else []


def resolved_edits(hint: AgentHint) -> list[Edit]:
    """All actions a hint asks for, in order: context_management edits, then the session_control alias."""
    edits = list(hint.context_management.edits) if hint.context_management is not None else []
    if hint.session_control is not None:
        edits.extend(hint.session_control.edits())
    return edits


def is_management_request(hint: AgentHint | None, num_messages: int) -> bool:
    """Whether the server must apply the hint's edits and not generate.

    `manage_request: true` says so explicitly; a hint carrying only a session_control alias with
    no messages has nothing to generate from, so it is a management request too.
    """
    if hint is None:
        return False
    if hint.context_management is not None:
        return hint.context_management.manage_request
    return hint.session_control is not None and num_messages == 0


def parse_agent_hint(
    body: Mapping, headers: Mapping[str, str], num_messages: int, num_tools: int,
    num_tokens: int | None = None,
) -> AgentHint | None:
    """Parse and validate the hint of one chat-completions request; None if it carries none.

    The identity comes from `body["agent_hint"]`; when that has no `session_id`, it comes from
    the `x-session-id` / `x-parent-session-id` headers. Raises `HintError` for anything malformed.
    `num_tokens`: the bound of a `tokens` range (None: this endpoint takes no `tokens` edit).
    """
    raw = body.get("agent_hint")
    if raw is None and _header(headers, SESSION_HEADER) is None:
        return None
    if raw is not None and not isinstance(raw, Mapping):
        raise HintError("agent_hint must be an object", "agent_hint")
    data = dict(raw or {})
    for key, value in zip(("session_id", "parent_session_id"), hint_identity(data, headers)):
        if value is not None:
            data[key] = value
    try:
        hint = AgentHint.model_validate(data)
    except ValidationError as exc:
        raise _to_hint_error(exc, in_body=raw is not None) from None
    _check_ranges_fit(hint, num_messages, num_tools, num_tokens)
    return hint


def hint_identity(raw_hint: Mapping, headers: Mapping[str, str]) -> tuple[object, object]:
    """(session_id, parent_session_id) as a request names them, unvalidated: the body's `agent_hint`'s, or,
    when that names no session (absent or null), the headers' (a blank header counts as absent); a gateway
    that sends `x-session-id` alone names a root session, its own parent (review rev27 A5: every call was a
    400; the body form still requires the parent). The one rule: the router places a request by what the
    instance will attribute it to (review rev26 A7)."""
    session, parent = raw_hint.get("session_id"), raw_hint.get("parent_session_id")
    header_session = _header(headers, SESSION_HEADER)
    if session is None and header_session is not None:
        session = header_session
        if parent is None:
            parent = _header(headers, PARENT_SESSION_HEADER) or header_session
    return session, parent


def _check_ranges_fit(hint: AgentHint, num_messages: int, num_tools: int, num_tokens: int | None) -> None:
    if hint.context_management is None:
        return
    sizes = {"messages": num_messages, "tools": num_tools, "tokens": num_tokens}
    for index, edit in enumerate(hint.context_management.edits):
        if edit.target == "tokens" and num_tokens is None:
            raise HintError(
                "target 'tokens' names token positions of a /v1/completions prompt; a chat request "
                "names the changed messages/tools instead",
                f"agent_hint.context_management.edits[{index}].target",
            )
        if edit.is_range and edit.end > sizes[edit.target]:
            raise HintError(
                f"end {edit.end} is beyond the {sizes[edit.target]} {edit.target} sent in this request",
                f"agent_hint.context_management.edits[{index}].end",
            )


def _to_hint_error(exc: ValidationError, *, in_body: bool) -> HintError:
    error = exc.errors()[0]
    loc = list(error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, _FieldError):
        loc.append(cause.field)
    param = _param(loc, in_body=in_body)
    if error["type"] == "missing":
        return HintError(f"{param} is required", param)
    message = str(cause) if isinstance(cause, ValueError) else error["msg"]
    return HintError(f"{param}: {message}", param)


def _param(loc: list, *, in_body: bool) -> str:
    if not in_body and loc == ["parent_session_id"]:
        return PARENT_SESSION_HEADER
    if not in_body and loc == ["session_id"]:
        return SESSION_HEADER
    path = "agent_hint"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive header lookup (HTTP names are); a blank value counts as absent."""
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value if value is not None and value.strip() else None
