"""Types the cache layer shares with the engine above it: session identity and resolved edits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(slots=True)
class SessionRef:
    """Who a request belongs to, as far as the cache is concerned (from the Agent Hint)."""

    tenant: str  # API key identity + cache_salt: sessions never cross tenants
    session_id: str
    parent_session_id: str
    ttl_s: float | None = None  # cache_control.ttl: soft protection for this long
    tool: str | None = None  # tool whose result this request carries (to learn tool gaps)


EditAction = Literal["evict", "offload", "prefetch"]


@dataclass(slots=True)
class CacheEdit:
    """An Agent Hint edit, resolved by the server to what the cache needs.

    `token_start` is None for a whole-session edit; for a messages/tools edit it is the first token
    position of the session's context that is stale (found by rendering the old window).
    """

    action: EditAction
    token_start: int | None = None


@dataclass(slots=True)
class EditOutcome:
    """What one edit did: blocks and tokens moved per tier (negative: left that tier)."""

    action: str  # evicted | offloaded | prefetched | none
    tiers: dict[str, tuple[int, int]] = field(default_factory=dict)  # tier -> (blocks, tokens)
    notes: list[str] = field(default_factory=list)
