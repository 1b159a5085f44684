"""Bounded session state: the registry forgets sessions nobody will come back to.

    ended      (evicted / stopped)  forgotten `ended_grace_s` after it was first seen ended
    idle       (no request)         forgotten after `idle_expiry_s` without a request
    over a cap (total / per tenant) the oldest idle sessions are forgotten first

Never forgotten: a session with a request in flight, or one whose sub-sessions are still
remembered (leaves go first; a parent goes on a later sweep). So the sessions that cannot be
forgotten are bounded by the requests in flight, and the registry by `max_sessions` plus those.
Forgetting drops the session's claims: its blocks stay cached on the device, unowned (first to
go), and their lower-tier copies are removed as after any request whose context moved on.

`SessionJanitor.sweep()` runs on the engine thread under the state lock, every
`sweep_interval_s` (the server calls it); it is O(sessions) plus a sort only when over a cap.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import Session, SessionState

# agent-core's longest time budget for one task is an hour; a session idle past it is gone.
DEFAULT_IDLE_EXPIRY_S = 3600.0


@dataclass(frozen=True, slots=True)
class SessionBounds:
    ended_grace_s: float = 60.0
    idle_expiry_s: float = DEFAULT_IDLE_EXPIRY_S
    max_sessions: int = 100_000
    max_sessions_per_tenant: int = 10_000

    def __post_init__(self) -> None:
        if self.ended_grace_s < 0 or self.idle_expiry_s <= 0:
            raise ValueError("ended_grace_s must be >= 0 and idle_expiry_s > 0")
        if self.max_sessions < 1 or self.max_sessions_per_tenant < 1:
            raise ValueError("max_sessions and max_sessions_per_tenant must be >= 1")


def _last_active(s: Session) -> float:
    return max(s.last_arrival, s.last_done)


class SessionJanitor:
    def __init__(self, sam: SessionAwareManager, bounds: SessionBounds) -> None:
        self.sam = sam
        self.bounds = bounds
        self._ended_seen: dict[str, float] = {}  # key -> when a sweep first saw it ended
        self.num_forgotten = 0

    def _forget(self, s: Session) -> bool:
        if s.children or s.num_inflight:
            return False
        orphans = self.sam.sessions.forget(s.key)
        if s.key in self.sam.sessions.sessions:
            return False
        self._ended_seen.pop(s.key, None)
        tiers = self.sam.kv.tiers
        if orphans and tiers is not None:
            tiers.remove_below(orphans)
        self.num_forgotten += 1
        return True

    def sweep(self, now: float) -> int:
        """Forget what the bounds say to; returns how many sessions were forgotten."""
        before = self.num_forgotten
        reg = self.sam.sessions.sessions
        b = self.bounds
        for s in list(reg.values()):
            if s.num_inflight or s.state is SessionState.ACTIVE:
                continue
            if s.state is SessionState.ENDED:
                seen = self._ended_seen.setdefault(s.key, now)
                if now - seen >= b.ended_grace_s:
                    self._forget(s)
            elif now - _last_active(s) >= b.idle_expiry_s and s.protect_until <= now:
                self._forget(s)
        self._ended_seen = {k: t for k, t in self._ended_seen.items() if k in reg}
        self._cap(list(reg.values()), b.max_sessions)
        per_tenant: dict[str, list[Session]] = {}
        for s in reg.values():
            per_tenant.setdefault(s.tenant, []).append(s)
        for group in per_tenant.values():
            self._cap(group, b.max_sessions_per_tenant)
        return self.num_forgotten - before

    def _cap(self, group: list[Session], cap: int) -> None:
        """Forget the oldest idle leaves of `group` until it fits `cap` (or none is left)."""
        excess = len(group) - cap
        if excess <= 0:
            return
        idle = [s for s in group if not s.num_inflight and s.state is not SessionState.ACTIVE]
        for s in heapq.nsmallest(len(idle), idle, key=_last_active):
            if excess <= 0:
                break
            if self._forget(s):
                excess -= 1

    def check_integrity(self) -> None:
        reg = self.sam.sessions.sessions
        assert all(k in reg for k in self._ended_seen), "janitor remembers a forgotten session"
