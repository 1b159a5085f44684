"""`sam-fine`: `sam` with its bands of predicted next use cut finer, so that the sessions of one
octave are reclaimed farthest return first.

`sam` ranks a live session by r = its predicted next use - now, in log bands of the turnaround Q
(r > 16Q, > 8Q, ..., > Q/8), and inside a band reclaims in the order the groups ENTERED it. For
sessions waiting on short tools that order is the wrong way round: every agent of a live swarm
whose tool gap is shorter than Q ranks in the band (Q, 2Q] when its call ends (r = gap + Q), so
the session that ended first, which is due back first, entered the band first and is reclaimed
first, while the one that just ended (due back last) keeps its blocks: LRU inside the band, where
Belady evicts the farthest. The thirteenth session's trace of a whole-workload sam+host round
found exactly that: 343 of the 374 resumed calls that reloaded from host were in that band when
they arrived, evicted by other calls' admissions in the ~0.3 s before.

Here each octave of `sam`'s bands is cut into SUB_BANDS bands (a factor 2^(1/SUB_BANDS) apart), so
two sessions land in different classes once their predicted returns differ by that factor, and
the one predicted back later goes first; a session moves up a band at each crossing
(`recheck_after`, as in `sam`). Everything else is `sam`'s: what nobody holds first, then
presumed-gone and suspended sessions, a leader waiting on live sub-agents in the farthest band,
the prefetched / TTL class on top; `protected_class` is still r <= Q (every queued request and
every session waiting on a tool due back within Q: `sam`'s), so a prefetch takes the same room as
under `sam`. The cut is a resolution, not a fitted constant: the
inputs are the sessions' and the system's own observed gaps and turnaround.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hintkv.cache.policies.base import register_policy
from hintkv.cache.policies.sam import BANDS, FIRST_BAND, GONE, MAX_RECHECK_S, SAMPolicy, band_class

if TYPE_CHECKING:
    from hintkv.cache.sessions import Session

SUB_BANDS = 8  # bands per octave of r / Q: returns 9% apart are told apart
# r / Q beyond each: one class lower (descending, from sam's farthest to its nearest threshold)
FINE_BANDS = tuple(BANDS[0] * 2.0 ** (-k / SUB_BANDS)
                   for k in range(round(math.log2(BANDS[0] / BANDS[-1])) * SUB_BANDS + 1))
FINE_PROTECTED = FIRST_BAND + len(FINE_BANDS) + 1  # prefetched or TTL
FINE_DUE_WITHIN_TURNAROUND = FIRST_BAND + sum(1 for t in FINE_BANDS if t >= 1.0)  # r <= Q


@register_policy("sam-fine")
class SAMFinePolicy(SAMPolicy):
    name = "sam-fine"
    num_classes = FINE_PROTECTED + 1
    protected_class = FINE_DUE_WITHIN_TURNAROUND
    __slots__ = ()

    def session_class(self, s: Session, now: float) -> int:
        c = super().session_class(s, now)
        if c <= GONE:
            return c
        if c > FIRST_BAND + len(BANDS):  # sam's protected class: prefetched or under a TTL
            return FINE_PROTECTED
        reg = self.sessions
        if reg is None:
            return c
        r = self._next_use(s, now, reg.predicted_wait())
        if r is None:  # (not reached: super() gave GONE) presumed gone
            return GONE
        return fine_band_class(r, reg.predicted_turnaround())

    def recheck_after(self, s: Session, now: float) -> float | None:
        after = super().recheck_after(s, now)
        r = self.next_use(s, now)
        if r is None or not math.isfinite(r) or self.sessions is None:
            return after
        q = self.sessions.predicted_turnaround()
        for t in FINE_BANDS:  # the next fine crossing (FINE_BANDS descend)
            if r > t * q:
                cross = r - t * q
                return cross if after is None or cross < after else after
        return after


def fine_band_class(r: float, q: float) -> int:
    """`sam.band_class` over FINE_BANDS: one class per threshold `r` is within."""
    return band_class(r, q, FINE_BANDS)
