"""`sam-order`: `sam`, with the suspended (offloaded) sessions ordered among themselves.

What the eviction audit (`hintkv bench policy_study --audit`) found: on claude-code 50-97% of the
victims Belady would have kept were "same class: suspended". An offload hint says "I wait on
something long" (97% of claude-code tool waits are >= 2 s, so nearly every waiting agent is
offloaded), and `sam` puts every suspended session into one class, GONE, reclaimed in LRU order
of groups: the one evicted often returns sooner than another suspended one Belady takes instead.

Here the suspended class is split by predicted return, and stays below every waiting, queued or
running session (the hint's meaning: this one is away for long), above what nobody holds:

    1  GONE: blocks of waiting (not suspended) sessions away far beyond their usual gap, as `sam`
    2  suspended, waiting on live sub-agents: it comes back after them (the farthest)
    3-11  suspended, by r = its predicted remaining wait: r > 16Q, > 8Q, ..., > Q/8, sooner
          (the same log bands of the turnaround Q as `sam`'s waiting sessions)
    12-  `sam`'s classes 2-11 (waiting, queued, running, prefetched), unchanged

The remaining wait is the gap distribution's conditional residual (`GapEstimator.residual`: the
median remaining part of the observed gaps, of the session, else of its last tool, else of
everyone, longer than the time it has been away; beyond every observed gap, as long again):
agents' waits are heavy-tailed, so one away for long is predicted away for long still, and it
sinks band by band; a suspended session is never presumed gone (claude-code tools run for
minutes; a presumed-gone cut ranked those below leaders waiting on sub-agents and cost 1.3
points of hit rate at 10 users, device 0.1). A leader waiting on sub-agents goes first: its
children run now and it reads its context only after the last one ends. A session's tail goes
before its head (`ClassRanking`), as everywhere. Every input is the session's or the system's
observed history; no constant depends on a workload.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hintkv.cache.policies.base import register_policy
from hintkv.cache.policies.sam import (
    BANDS,
    DUE_WITHIN_TURNAROUND,
    FIRST_BAND,
    GONE,
    MAX_RECHECK_S,
    PROTECTED,
    SAMPolicy,
    band_class,
)
from hintkv.cache.sessions import SessionState

if TYPE_CHECKING:
    from hintkv.cache.sessions import Session

AFTER_CHILDREN = GONE + 1  # 2: suspended until its live sub-agents end
FIRST_SUSPENDED = AFTER_CHILDREN + 1  # 3: suspended, predicted back in > 16Q
SHIFT = FIRST_SUSPENDED + len(BANDS) + 1 - (GONE + 1)  # sam's class c >= 2 becomes c + SHIFT
_LIVE_CHILD = (SessionState.ACTIVE, SessionState.WAITING, SessionState.SUSPENDED)


@register_policy("sam-order")
class SAMOrderPolicy(SAMPolicy):
    name = "sam-order"
    num_classes = PROTECTED + SHIFT + 1
    protected_class = DUE_WITHIN_TURNAROUND + SHIFT

    def session_class(self, s: Session, now: float) -> int:
        c = super().session_class(s, now)
        if c != GONE:
            return c + SHIFT if c > GONE else c
        if s.state is not SessionState.SUSPENDED or self.sessions is None:
            return GONE  # a waiting session away far beyond its usual gap: presumed gone
        r = self.suspended_return(s, now)
        if math.isinf(r):
            return AFTER_CHILDREN
        q = self.sessions.predicted_turnaround()
        return FIRST_SUSPENDED + band_class(r, q) - FIRST_BAND  # sam's bands, from FIRST_SUSPENDED

    def suspended_return(self, s: Session, now: float) -> float:
        """Seconds until a suspended session's next call is predicted (math.inf: after its live
        sub-agents)."""
        reg = self.sessions
        if s.children and any(c in reg.sessions and reg.sessions[c].state in _LIVE_CHILD for c in s.children):
            return math.inf
        est = reg.gap_estimator(s)
        away = now - s.last_done
        return est.residual(away) if est.known else reg.predicted_gap(s)[0] - away

    def recheck_after(self, s: Session, now: float) -> float | None:
        if s.state is not SessionState.SUSPENDED or self.sessions is None:
            return super().recheck_after(s, now)
        times = [MAX_RECHECK_S]  # live children ending, estimates moving
        r = self.suspended_return(s, now)
        if math.isfinite(r):
            q = self.sessions.predicted_turnaround()
            times += [r - t * q for t in BANDS if r > t * q]
        if s.protect_until > now:
            times.append(s.protect_until - now)
        times = [t for t in times if t > 0]
        return min(times) if times else None
