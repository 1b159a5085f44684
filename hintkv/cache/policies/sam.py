"""`sam`: session-aware eviction order, from what the agents told us (Agent Hint).

Reclaimed first to last:
  0. blocks no live session holds (LRU among them);
  1. blocks of suspended sessions, or of waiting sessions idle far beyond their usual gap;
  2. blocks of waiting sessions, the one predicted to come back furthest in the future first;
  3. blocks of sessions running now, prefetched, or under cache_control TTL.
A block shared by several sessions ranks by its most protective holder. Protection only orders
victims; it never refuses an allocation.
"""

from __future__ import annotations

import time
from typing import Any

from hintkv.cache.policies.base import EvictionPolicy, register_policy
from hintkv.cache.sessions import SessionRegistry


@register_policy("sam")
class SAMPolicy(EvictionPolicy):
    name = "sam"

    def __init__(self, sessions: SessionRegistry | None = None, **_: Any) -> None:
        self.sessions = sessions if sessions is not None else SessionRegistry()
        self._now = time.monotonic()
        self._memo: dict[str, tuple[int, float]] = {}

    def prepare(self) -> None:
        self._now = time.monotonic()
        self._memo.clear()

    def _rank(self, key: str) -> tuple[int, float]:
        r = self._memo.get(key)
        if r is None:
            r = self._memo[key] = self.sessions.rank(self.sessions.sessions[key], self._now)
        return r

    def key(self, block: Any) -> tuple:
        owners = self.sessions.holders.get(block.hash) if block.hash is not None else None
        if not owners:
            return (0, 0.0, block.last_access)
        best = max(self._rank(k) for k in owners)
        return (*best, block.last_access)
