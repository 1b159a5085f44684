"""How long a queued prompt without room waits at least: told to SAM, which ranks the session's
kept prefix by it (a queued session's next use is no sooner: `Session.blocked_until`), and whether
its kept prefix lapses meanwhile.

A waiting candidate the admission finds no room for waits for running sequences to end: each then
frees the blocks it holds to its end (`blocks_to_end`). A running prefill cannot end before the
rest of its prompt is computed, at the engine's measured prefill cost per token (the tier
connector's `TransferCosts.prefill_s_per_token`; without tiers nothing is estimated). So room for
the candidate opens no sooner than when the running sequences, soonest first, have freed its
shortfall. A decode's bound is 0, so a shortfall that decodes' blocks cover gives no wait: only a
long running prefill that holds the room moves the ranking. Why it matters (issue #9, 100 users):
a 450K-token queued prefix ranked "due within Q" while a 496K-token cold prefill ran 253 s more,
so the decodes' growth took the room of the short calls behind it instead of that prefix (lru took
the prefix, and let them in 43 s sooner). The same wait also decides whether the candidate keeps
its resident prefix from the candidates after it this step (`lapses`: not when the wait is longer
than getting the prefix back). The wait is estimated only where one of them uses it. Runs on the engine thread, under its state lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hintkv.engine.admission import StepPlan, blocks_to_end, kept_free

if TYPE_CHECKING:
    from hintkv.cache.manager import PrefixMatch
    from hintkv.engine.scheduler import Scheduler
    from hintkv.engine.sequence import Sequence

# a new estimate within this share of the current wait re-ranks nothing (each step's estimate moves
# a little as the prefill runs: a re-rank per step would cost a class walk for nothing)
TOLERANCE = 0.1


def earliest_room_s(sch: Scheduler, seq: Sequence, match: PrefixMatch, plan: StepPlan) -> float:
    """Seconds from now before room for waiting `seq` (its device run `match`) can open, at the
    least (0.0: it may open at any step, or nothing running frees enough: no claim)."""
    kv, mml = sch.kv, sch.max_model_len
    if kv.tiers is None:
        return 0.0
    bs = kv.block_size
    short = blocks_to_end(seq, bs, mml) - match.num_held - kept_free(plan, match, kv)
    if short <= 0:
        return 0.0
    token_s = kv.tiers.costs.prefill_s_per_token
    ends = [(max(0, s.num_prompt_tokens - s.num_computed_tokens) * token_s, blocks_to_end(s, bs, mml))
            for s in sch.running]
    ends += [(0.0, blocks_to_end(s, bs, mml)) for s in sch.loading]  # part of its prefill loads
    ends.sort()
    for t, blocks in ends:
        short -= blocks
        if short <= 0:
            return t
    return 0.0


def lapses(sch: Scheduler, match: PrefixMatch, wait: Callable[[], float]) -> bool:
    """True: a skipped candidate that waits `wait()` seconds for room (`earliest_room_s`, asked
    only here past the cheap checks) no longer keeps its resident prefix (`match`) from the
    candidates after it (the admission policy asks, in `AdmissionPolicy.skipped`: not for a
    candidate it reserves room for). Kept, those blocks sit idle for the whole wait while the
    short calls behind it find no room; let go, a later admission may take them (written down to
    the top tier first, as any held session's evicted blocks), and they come back when the
    candidate's room opens, at their reload (or recompute, the cheaper: `TransferCosts.regain_s`)
    cost per block. So the prefix lapses when the wait is longer than that cost: the room then
    serves someone meanwhile at a price below the wait it saves. What the calls admitted into
    that room add to the candidate's own wait is not priced: their blocks to their end are still
    held when its room would have opened. That is bounded by the policy's `max_skips` (each
    admission past it counts one; then it is starving and nothing goes past it). Both hinted and
    unhinted tiered runs (engine knowledge)."""
    tiers = sch.kv.tiers
    if tiers is None or not match.blocks:
        return False
    t = wait()
    return t > 0 and t > len(match.blocks) * tiers.costs.regain_s(tiers.stack.tiers[0].name)


def note_blocked(sch: Scheduler, seq: Sequence, wait: Callable[[], float], now: float) -> None:
    """Waiting `seq` found no room in this step, and waits `wait()` seconds at least
    (`earliest_room_s`, asked only for a hinted session): tell SAM when room opens at the earliest."""
    key = seq.session_key
    if key is None or not sch.hints or sch.kv.tiers is None:
        return
    t = wait()
    sch.sam.sessions.block(key, now + t if t > 0 else 0.0, now, TOLERANCE)


def note_admitted(sch: Scheduler, seq: Sequence, now: float, first: bool) -> None:
    """`seq` (out of the queue) was admitted: SAM learns its queue wait (`predicted_wait`: its
    blocks are read now), and its session is no longer held back (ranked as in flight again),
    unless another request of it still queues (the wait is the session's). `first`: its first
    admission (`Sequence.admitted_once` as it was before this one: the one flag that decides
    "first" here, in `note_left_queued` and in `KVCacheManager.admit`)."""
    key = seq.session_key
    if key is None or not sch.hints:
        return
    sessions = sch.sam.sessions
    if first:  # its own wait (a readmission after a preemption is no new one)
        sessions.on_admitted(key, now, seq.arrival)
    if not any(s.session_key == key for s in sch.waiting):
        sessions.block(key, 0.0, now)


def note_left_queued(sch: Scheduler, seq: Sequence, now: float) -> None:
    """`seq` ends in WAITING status: if it was never admitted (aborted queued, or refused as larger
    than the whole pool), SAM learns its own wait (its arrival to now) before its end is counted, so
    the end does not fall back to the session's latest arrival. That wait is a lower bound (the
    request would have waited at least that long): an admission would have told a longer one. A
    sequence admitted before (preempted back to the queue, or a running one that outgrew the whole
    pool, set WAITING in no queue) told its wait at its first admission: nothing again, or another
    queued request of its session would lose its count."""
    if seq.session_key is not None and sch.hints and not seq.admitted_once:
        sch.sam.sessions.on_admitted(seq.session_key, now, seq.arrival)


def note_left_early(sch: Scheduler, seq: Sequence, now: float) -> None:
    """Running or loading `seq` left before its end (preempted, aborted): room may open sooner
    than any queued session was told, so each is ranked as in flight again until the admission
    reaches it and tells its wait anew (a stale wait kept its prefix in the farthest band)."""
    if not sch.hints or sch.kv.tiers is None:
        return
    for key in {s.session_key for s in sch.waiting if s.session_key is not None and s is not seq}:
        sch.sam.sessions.block(key, 0.0, now)
