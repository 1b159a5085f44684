"""When each session's class is computed again without an event: `ClassRanking`'s rechecks.

A session's class can move with the clock alone (its predicted return comes closer, a TTL runs
out). The policy says when (`EvictionPolicy.recheck_after`); this keeps those times in a heap.
An event only files the session as changed (`unscheduled`: a dict store, the cost every event
pays); its recheck is computed and pushed at the next tick, once per session per step, as of its
latest event. A recheck is void once a later event bumped the session's `rank_version`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from hintkv.cache.policies.base import EvictionPolicy

if TYPE_CHECKING:
    from hintkv.cache.sessions import Session


class Rechecks:
    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        # sessions with an event since the last tick -> (the session, its latest event's time);
        # the ranking writes it directly (one dict, never rebound)
        self.unscheduled: dict[str, tuple[Session, float]] = {}
        self._heap: list[tuple[float, int, str]] = []  # (due, version, session key)

    def due(self, now: float, sessions: Mapping[str, Session],
            budget: int | None = None) -> Iterator[Session]:
        """The sessions whose recheck is due by `now`, earliest first, at most `budget` (the rest
        stay due). Lazy: the caller re-ranks each before the next is read."""
        self._push()
        heap, n = self._heap, 0
        while heap and heap[0][0] <= now and (budget is None or n < budget):
            _, version, key = heapq.heappop(heap)
            s = sessions.get(key)
            if s is None or s.rank_version != version:
                continue  # superseded by a later event
            n += 1
            yield s

    def next_due(self) -> float:
        """The earliest time at which `due` yields a session (math.inf: none is scheduled;
        -math.inf: sessions changed since the last tick, whose rechecks that tick schedules).
        A superseded recheck still counts (its tick is early, never late)."""
        if self.unscheduled:
            return -math.inf
        return self._heap[0][0] if self._heap else math.inf

    def _push(self) -> None:
        """Schedule the recheck of each session changed since the last tick, as of its latest
        event (the due time is the one computed at the event; only the registry's shared
        estimates may have moved since, within one step)."""
        for key, (s, at) in self.unscheduled.items():
            after = self.policy.recheck_after(s, at)
            if after is not None:
                heapq.heappush(self._heap, (at + max(after, 0.0) + 1e-3, s.rank_version, key))
        self.unscheduled.clear()
