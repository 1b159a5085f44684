"""What the server reports back about a hint it applied: the `agent_hint_result` reply field.

A management request is answered with an ordinary chat-completion envelope (which is all the
openJiuwen client needs to count it a success); this extra field says what was actually done,
per edit and per tier, so tests, benchmarks and curious clients can see it:

    "agent_hint_result": {
      "session_id": "sub-1", "parent_session_id": "main-0", "manage_request": true,
      "edits": [{"type": "offload", "target": "session", "start": null, "end": null,
                 "action": "offloaded", "token_start": null,
                 "tiers": {"device": {"blocks": -12, "tokens": -192}, "host": {"blocks": 12, "tokens": 192}},
                 "notes": []}],
      "notes": []}

`tiers` counts change per tier (negative: left that tier); `token_start` is, for a range edit,
the first token position found stale by rendering the old window (hintkv.protocol.ranges).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hintkv.protocol.agent_hint import EditTarget, EditType

# "none": nothing to do (e.g. the session holds no KV); "skipped": refused or not supported here.
EditAction = Literal["evicted", "offloaded", "prefetched", "none", "skipped"]


class TierCount(BaseModel):
    """Blocks and tokens one edit moved into (+) or out of (-) one tier."""

    model_config = ConfigDict(frozen=True)

    blocks: int = 0
    tokens: int = 0


class EditResult(BaseModel):
    """The outcome of one resolved edit."""

    type: EditType
    target: EditTarget
    start: int | None = None
    end: int | None = None
    action: EditAction
    token_start: int | None = None
    tiers: dict[str, TierCount] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class AgentHintResult(BaseModel):
    """The `agent_hint_result` field of a reply: one EditResult per resolved edit, in order."""

    session_id: str
    parent_session_id: str
    manage_request: bool
    edits: list[EditResult] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
