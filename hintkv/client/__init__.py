"""hintkv.client: Agent Hint helpers for users of the `openai` SDK.

- hints.py:     `hint(...)` / `manage_hint(...)` extra_body dicts and edit builders
- identity.py:  `Session` and the id patterns of team members, compressors and sub-agents
- lifecycle.py: `SessionClient` / `AsyncSessionClient`: chat with the hint, and prepare /
                suspend / release / release_tree / context_changed management requests that
                never raise (they return an `ActionResult`)
"""

from hintkv.client.hints import hint, manage_hint, messages_edit, session_edit, tokens_edit, tools_edit
from hintkv.client.identity import (
    Session,
    compressor,
    compressor_id,
    sub_agent,
    sub_agent_id,
    team_member,
    team_member_id,
)
from hintkv.client.lifecycle import ActionResult, AsyncSessionClient, SessionClient, action_timeout

__all__ = [
    "ActionResult",
    "AsyncSessionClient",
    "Session",
    "SessionClient",
    "action_timeout",
    "compressor",
    "compressor_id",
    "hint",
    "manage_hint",
    "messages_edit",
    "session_edit",
    "sub_agent",
    "sub_agent_id",
    "team_member",
    "team_member_id",
    "tokens_edit",
    "tools_edit",
]
