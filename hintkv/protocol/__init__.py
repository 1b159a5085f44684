"""hintkv.protocol: the Agent Hint wire protocol -- request types, validation, reply types, ranges.

- agent_hint.py: `AgentHint` and its parts, `parse_agent_hint`, `resolved_edits`
- errors.py:     `HintError` (message + exact param; maps to an OpenAI HTTP 400)
- ranges.py:     messages/tools range edit -> first stale token position
- result.py:     `AgentHintResult`, the `agent_hint_result` field of a reply
"""

from hintkv.protocol.agent_hint import (
    AgentHint,
    CacheControl,
    ContextManagement,
    Edit,
    SessionControl,
    is_management_request,
    parse_agent_hint,
    resolved_edits,
)
from hintkv.protocol.errors import HintError
from hintkv.protocol.ranges import range_starts, stale_token_start
from hintkv.protocol.result import AgentHintResult, EditResult, TierCount

__all__ = [
    "AgentHint",
    "AgentHintResult",
    "CacheControl",
    "ContextManagement",
    "Edit",
    "EditResult",
    "HintError",
    "SessionControl",
    "TierCount",
    "is_management_request",
    "parse_agent_hint",
    "range_starts",
    "resolved_edits",
    "stale_token_start",
]
