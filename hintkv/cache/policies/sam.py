"""`sam`: session-aware eviction by predicted next use (Belady's rule, from what agents say).

Belady evicts the block whose next use is farthest. SAM predicts when each live session's blocks
are read again and ranks sessions by that time, on a log scale relative to the system's own
recent turnaround Q (a request's arrival to its end: the queue's wait plus the run; see
`SessionRegistry.predicted_turnaround`). A request's blocks are read at its admission, W after
its arrival (the queue's wait, `SessionRegistry.predicted_wait`; W = Q where the engine tells no
admission):

    in flight (queued or running)  next use = its arrival + W    (an old arrival: the queue's head),
                                   no sooner than the time the scheduler says room opens for it
                                   (`Session.blocked_until`: a queued prompt behind a long prefill)
    waiting on a tool              next use = its last end + predicted gap + W
    waiting on live sub-agents     comes back after them: the farthest band
    suspended, or idle far beyond its usual gap: presumed gone; ended: holds nothing

Classes, reclaimed first to last:
    0  UNHELD: blocks no live session holds (ended sessions, orphaned context)
    1  GONE: suspended (offloaded), or idle far beyond its usual gap
    2-10  by r = predicted next use - now: r > 16Q, > 8Q, > 4Q, > 2Q, > Q, > Q/2, > Q/4, > Q/8, sooner
    11 prefetched (until the call it announced arrives), or under a cache_control TTL
A prefetch never takes the room of a session due within one turnaround, nor does an eager offload
hint drop its device copies (class >= 7, r <= Q): every queued request (what `qlru` protects) and,
since r counts W rather than Q, every session waiting on a tool due back within Q. Protecting only
r <= W (in flight or overdue, the rule before W) gave the same runs to the digit (100 users lazy
and eager, 10 users; docs/benchmarks/history/sim.md, twentieth session, scale5). A block shared by
several sessions ranks by its most protective holder; a session's tail goes before its head
(`ClassRanking`).

Why this resists the scan that made `sam-v1` thrash like LRU: when more sessions cycle than fit,
the session that just finished is the farthest from its next turn (every queued and waiting
session comes first), so it lands in a low band and is reclaimed first, MRU on a cycle as Belady
does, while sessions nearer their turn keep their blocks and hit. A session moves up a band as its
turn comes closer (`recheck_after`: at each band crossing). Every input is the session's or the
system's own observed history (gaps, turnaround); no constant depends on a workload.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hintkv.cache.policies.base import EvictionPolicy, register_policy
from hintkv.cache.sessions import PREFETCH_GRACE_S, SessionState

if TYPE_CHECKING:
    from hintkv.cache.sessions import Session, SessionRegistry

GONE = 1
FIRST_BAND = 2
BANDS = (16.0, 8.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.125)  # r / Q beyond each: one class lower
PROTECTED = FIRST_BAND + len(BANDS) + 1  # 11: prefetched or TTL
RUNNING = PROTECTED  # the top class (name kept for callers of sam-v1's constant)
DUE_WITHIN_TURNAROUND = FIRST_BAND + sum(1 for t in BANDS if t >= 1.0)  # 7: r <= Q
_FARTHEST = BANDS[0]
MAX_RECHECK_S = 5.0  # estimates drift (shared gap and turnaround means): re-rank at least this often
_LIVE_CHILD = (SessionState.ACTIVE, SessionState.WAITING)
# the states as module constants: an enum member read through its class costs ~0.25 us on
# Python 3.11 (EnumType's `__getattr__` leaves the attribute read unspecialized), and every
# arrival and request end computes a class
_ACTIVE, _WAITING = SessionState.ACTIVE, SessionState.WAITING


@register_policy("sam")
class SAMPolicy(EvictionPolicy):
    name = "sam"
    num_classes = PROTECTED + 1
    protected_class = DUE_WITHIN_TURNAROUND
    uses_sessions = True

    # a waiting or (sam-dist) suspended session is ranked by its predicted return; a subclass
    # widens these and predicts the wait in `_waiting_next_use`
    away_states: tuple[SessionState, ...] = (SessionState.WAITING,)
    live_child_states: tuple[SessionState, ...] = _LIVE_CHILD
    __slots__ = ("_own_wait",)

    def __init__(self, sessions: SessionRegistry | None = None, **context: Any) -> None:
        super().__init__(sessions, **context)
        # `_waiting_next_use` is this class's: `session_class` computes it inline (every request
        # end: a call less); a subclass's own is called
        self._own_wait = type(self)._waiting_next_use is SAMPolicy._waiting_next_use

    def next_use(self, s: Session, now: float) -> float | None:
        """Predicted seconds until `s`'s blocks are read again (math.inf: after its live
        sub-agents); None: presumed gone."""
        reg = self.sessions
        if reg is None:
            return 0.0 if s.state is _ACTIVE else None
        return self._next_use(s, now, reg.predicted_wait())

    def _next_use(self, s: Session, now: float, w: float) -> float | None:
        """`next_use` with the registry's queue wait `w` already read (the class needs it too)."""
        if s.state is _ACTIVE:
            r = w - (now - s.last_arrival)  # exactly w at arrival ((a + w) - a rounds past w half the time)
            return max(r, s.blocked_until - now)
        if s.state not in self.away_states:
            return None
        if s.children and self._after_children(s):
            return math.inf
        return self._waiting_next_use(s, now, w)

    def _after_children(self, s: Session) -> bool:
        """Some sub-agent of `s` is live: `s` comes back after them."""
        reg = self.sessions.sessions
        return any(c in reg and reg[c].state in self.live_child_states for c in s.children)

    def _waiting_next_use(self, s: Session, now: float, w: float) -> float | None:
        """Predicted next use of a session away between calls (no live sub-agents), its queue
        wait `w` included."""
        own = s.gap_prediction  # its own history first (`predicted_gap`, inline: every request's end)
        expected, stale = own if own is not None else self.sessions.predicted_gap(s)
        away = now - s.last_done
        if away > stale:
            return None
        return expected + w - away

    def _gone_after(self, s: Session, now: float) -> float | None:
        """Seconds until an away session is presumed gone (a class change of its own); None:
        never."""
        if s.state is _WAITING:
            return s.last_done + self.sessions.predicted_gap(s)[1] - now
        return None

    @staticmethod
    def prefetch_pending(s: Session, now: float) -> bool:
        """Prefetched and its call not yet arrived: the prefetch announced that call, so once the
        call came the session is ranked by its own state again (not protected for the grace)."""
        return s.prefetched_until > now and s.last_arrival < s.prefetched_until - PREFETCH_GRACE_S

    def session_class(self, s: Session, now: float) -> int:
        if s.protect_until > now or (s.prefetched_until > now and self.prefetch_pending(s, now)):
            return PROTECTED
        reg = self.sessions
        if reg is None:
            return FIRST_BAND + len(BANDS) if s.state is _ACTIVE else GONE
        # `_next_use`, inline (every arrival and request end computes this: fewer calls)
        state = s.state
        if state is _ACTIVE:
            q = reg.turnaround_q  # (`predicted_turnaround()`, read directly)
            if s.blocked_until > now:  # queued, no room before then (a long prefill runs):
                return band_class(self._next_use(s, now, reg.wait_q), q)  # the one rule, `_next_use`'s
            return band_class(reg.wait_q - (now - s.last_arrival), q)  # (exactly w at arrival)
        # waiting is away in every subclass: its class attribute is read only for other states
        # (a read through the instance that Python 3.11 does not specialize)
        if state is not _WAITING and state not in self.away_states:
            return GONE
        q = reg.turnaround_q  # (`predicted_turnaround()`, read directly)
        if s.children and self._after_children(s):
            return FIRST_BAND  # next use after its live sub-agents: r = inf, the farthest band
        if self._own_wait:  # `_waiting_next_use`, inline
            own = s.gap_prediction
            expected, stale = own if own is not None else reg.predicted_gap(s)
            away = now - s.last_done
            if away > stale:
                return GONE
            r = expected + reg.wait_q - away
        else:
            r = self._waiting_next_use(s, now, reg.wait_q)
            if r is None:
                return GONE
        if r > _FARTHEST * q:  # `band_class`'s first test, inline: a request's end, mostly
            return FIRST_BAND
        return band_class(r, q)

    def recheck_after(self, s: Session, now: float) -> float | None:
        times = [t - now for t in (s.prefetched_until if self.prefetch_pending(s, now) else 0.0, s.protect_until)
                 if t > now]
        r = self.next_use(s, now)
        if r is not None and self.sessions is not None:
            times.append(MAX_RECHECK_S)  # also: live children ending, estimates moving
            if math.isfinite(r):
                q = self.sessions.predicted_turnaround()
                for t in BANDS:  # the next band crossing: the widest band it is beyond (BANDS
                    if r > t * q:  # descend, so r - t * q is least at the first such t)
                        times.append(r - t * q)
                        break
            gone = self._gone_after(s, now)
            if gone is not None:
                times.append(gone)
        times = [t for t in times if t > 0]
        return min(times) if times else None


def band_class(r: float, q: float, bands: tuple[float, ...] = BANDS) -> int:
    """The class of a session predicted back in `r` seconds, turnaround `q`: one band per
    threshold of `bands` it is within (they descend, so those are a prefix of them)."""
    n = 0
    for t in bands:
        if r > t * q:
            break
        n += 1
    return FIRST_BAND + n
