"""Who a request belongs to: the `Session` identity and the id patterns agent frameworks use.

A session is one agent context whose KV the server tracks (`session_id`), inside a tree rooted
at `parent_session_id` (the task or team it belongs to; a root session is its own parent).
openJiuwen agent-core derives child ids with three patterns, reproduced here so a swarm that
talks to hintkv directly names its agents the same way:

    team member   team:{team_session}:team:{team_id}:member:{member_id}   parent: team session
    compressor    {owner}:compressor:{round-level|current-round|dialogue} parent: owner
    sub-agent     {parent}_sub_{task_id}                                  parent: parent
"""

from __future__ import annotations

from dataclasses import dataclass

COMPRESSOR_KINDS = ("round-level", "current-round", "dialogue")


@dataclass(frozen=True, slots=True)
class Session:
    """One agent context's KV identity."""

    session_id: str
    parent_session_id: str | None = None  # None: a root session, its own parent

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, str) or not self.session_id.strip():
            raise ValueError("session_id must be a non-empty string")
        if self.parent_session_id is not None and (
            not isinstance(self.parent_session_id, str) or not self.parent_session_id.strip()
        ):
            raise ValueError("parent_session_id must be a non-empty string or None")

    @property
    def parent(self) -> str:
        """The parent id as sent on the wire (a root sends its own id)."""
        return self.parent_session_id or self.session_id

    @property
    def is_root(self) -> bool:
        return self.parent == self.session_id


def as_session(session: Session | str) -> Session:
    """Accept a bare id where a Session is expected (a root session)."""
    return session if isinstance(session, Session) else Session(session)


def team_member_id(team_session: str, team_id: str, member_id: str) -> str:
    _require(team_session=team_session, team_id=team_id, member_id=member_id)
    return f"team:{team_session}:team:{team_id}:member:{member_id}"


def compressor_id(owner: str, kind: str) -> str:
    """The context of a context compressor working for `owner`."""
    _require(owner=owner)
    if kind not in COMPRESSOR_KINDS:
        raise ValueError(f"compressor kind must be one of {COMPRESSOR_KINDS}, got {kind!r}")
    return f"{owner}:compressor:{kind}"


def sub_agent_id(parent: str, task_id: str) -> str:
    """A sub-agent started by a task tool of `parent`."""
    _require(parent=parent, task_id=task_id)
    return f"{parent}_sub_{task_id}"


def team_member(team_session: str, team_id: str, member_id: str, parent: str | None = None) -> Session:
    """A team member's session; its tree is the team session unless `parent` says otherwise."""
    return Session(team_member_id(team_session, team_id, member_id), parent or team_session)


def compressor(owner: str, kind: str) -> Session:
    return Session(compressor_id(owner, kind), owner)


def sub_agent(parent: str, task_id: str) -> Session:
    return Session(sub_agent_id(parent, task_id), parent)


def _require(**parts: str) -> None:
    for name, value in parts.items():
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty string")
