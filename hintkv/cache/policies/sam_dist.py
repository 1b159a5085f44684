"""`sam-dist`: `sam` with a distributional next-use prediction, and offloaded sessions ranked too.

What the eviction audit (`hintkv.replay.audit`, `hintkv bench policy_study --audit`) found `sam`
losing to Belady, and what this variant changes (everything else is `sam`'s, classes included):

1. Suspended sessions. An `offload` hint says "I wait on something long", not "I am gone": the
   session comes back when its tool (or its sub-agents) return. `sam` puts every suspended session
   in one class (GONE) and reclaims them in LRU order of groups; on claude-code, device only, that
   was ~95% of the victims the oracle would have kept. Here a suspended session is ranked like a
   waiting one, by its predicted return (its blocks still go before any session due sooner).
2. Heavy-tailed gaps. `sam` predicts a waiting session's return from an EWMA mean of its gaps and
   presumes it gone past a multiple of that. Here the prediction is the conditional residual
   `GapEstimator.residual(elapsed)`: the median remaining wait among the observed gaps (of the
   session, else of its tool, else of everyone) longer than the time already waited. A session
   that has waited long is predicted to wait long still, so it sinks band by band instead of
   falling off a cliff; nothing is presumed gone (a session that really left sinks to the
   farthest band, reclaimed right after what nobody holds).

Leaders waiting on live sub-agents stay in the farthest band (they come back after them), and
queued or running sessions rank as in `sam`. No constant here depends on a workload: the inputs
are the session's and the system's own observed gaps and turnaround.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hintkv.cache.policies.base import register_policy
from hintkv.cache.policies.sam import SAMPolicy
from hintkv.cache.sessions import SessionState

if TYPE_CHECKING:
    from hintkv.cache.sessions import Session

_AWAY = (SessionState.WAITING, SessionState.SUSPENDED)
_LIVE_CHILD = (SessionState.ACTIVE, SessionState.WAITING, SessionState.SUSPENDED)
DEFAULT_GAP_S = 5.0  # before any gap was observed anywhere (the first minutes of a server)


@register_policy("sam-dist")
class SAMDistPolicy(SAMPolicy):
    name = "sam-dist"

    away_states = _AWAY
    live_child_states = _LIVE_CHILD

    def _waiting_next_use(self, s: Session, now: float, w: float) -> float | None:
        est = self.sessions.gap_estimator(s)
        elapsed = now - s.last_done
        remaining = est.residual(elapsed) if est.known else max(DEFAULT_GAP_S - elapsed, elapsed)
        return remaining + w

    def _gone_after(self, s: Session, now: float) -> float | None:
        """Never presumed gone: the residual moves with the wait, so the period bound
        (MAX_RECHECK_S) re-ranks it."""
        return None
