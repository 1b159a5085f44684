"""`sam-v1`: the first session-aware order (kept for the policy study; `sam` replaced it).

It thrashes like LRU when more running sessions cycle than fit: all of them share its top class.

Classes, reclaimed first to last:
  0  blocks no live session holds (ended sessions, orphaned context);
  1  suspended (offloaded) sessions, and waiting sessions idle far beyond their usual gap;
  2-5  waiting sessions, by how soon they are predicted back: > 60 s, > 10 s, > 2 s, sooner;
  6  sessions running now, prefetched, or under cache_control TTL.
A block shared by several sessions ranks by its most protective holder. A waiting session moves
up a band as its predicted return comes closer (`recheck_after`), not on every allocation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hintkv.cache.policies.base import EvictionPolicy, register_policy
from hintkv.cache.sessions import SessionState

if TYPE_CHECKING:
    from hintkv.cache.sessions import Session

GONE = 1  # suspended, or presumed gone
WAIT_BANDS_S = (60.0, 10.0, 2.0)  # predicted seconds until return: beyond each, one class lower
FIRST_WAIT = 2
RUNNING = FIRST_WAIT + len(WAIT_BANDS_S) + 1  # 6
MAX_RECHECK_S = 5.0  # a waiting session's prediction may drift (shared gap estimates): re-rank


@register_policy("sam-v1")
class SAMv1Policy(EvictionPolicy):
    name = "sam-v1"
    num_classes = RUNNING + 1
    protected_class = RUNNING
    uses_sessions = True

    def _protected(self, s: Session, now: float) -> bool:
        return s.state is SessionState.ACTIVE or s.prefetched_until > now or s.protect_until > now

    def session_class(self, s: Session, now: float) -> int:
        if self._protected(s, now):
            return RUNNING
        if s.state is not SessionState.WAITING or self.sessions is None:
            return GONE
        expected, stale = self.sessions.predicted_gap(s)
        if now - s.last_done > stale:
            return GONE
        remaining = s.last_done + expected - now
        return FIRST_WAIT + sum(1 for t in WAIT_BANDS_S if remaining <= t)

    def recheck_after(self, s: Session, now: float) -> float | None:
        times = [t - now for t in (s.prefetched_until, s.protect_until) if t > now]
        if s.state is SessionState.WAITING and self.sessions is not None:
            expected, stale = self.sessions.predicted_gap(s)
            gone_at = s.last_done + stale
            if gone_at > now:
                times.append(gone_at - now)
                remaining = s.last_done + expected - now
                times += [remaining - t for t in WAIT_BANDS_S if remaining > t]
                times.append(MAX_RECHECK_S)
        return min(times) if times else None
