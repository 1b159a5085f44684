"""`cache-aware-serial`: cache-aware admission that waits for a returner when waiting is cheaper.

A session that just finished a call and waits on a short tool comes back soon with the same
context plus a little. A queued request admitted meanwhile takes its room from whatever the
eviction policy ranks lowest; when that room can only come out of the returner's resident
context (two contexts that do not fit side by side: claude-code leaders each over half the
device, swe-agent on a device of one request), both lose: the request evicts the returner's tail,
the returner comes back to a miss, and its call in turn evicts the request's session. The offline
study (issue 8) found this interleaving, not the choice of victims, behind most of sam's
remaining gap to the oracle. Holding the request until the returner is back serializes the two
sessions, but a hold idles the prefill server, and most returners are not back when their mean
gap says (measured: 3 of 8 and 21 of 56 holds in two swe-agent cells), so every hold is judged:

    saved(h) = sum over returners i of P_i(back within h) * (lost_r_i + lost_c_i) * block_size * prefill_s_per_token
    hold for the h that maximizes saved(h) - h, if that is > 0

- `lost_r_i`: the blocks of returner i that admitting the candidate would evict (what it is short
  of room, taken from the returners' blocks lowest block class first, as eviction picks them);
- `lost_c_i`: the candidate's own context returner i evicts in turn when it comes back
  (`returner + candidate - device`, when positive and i loses blocks: the two do not fit side by side), counted
  only when the candidate is the only one waiting: with others queued, their admissions evict it
  anyway (measured: counting it with a queue held more in the swe-agent cells, whose TTFT then
  rose 6-12% in the replay's time model while the recompute saved did not cover the holds);
- `P_i`: from returner i's observed gaps (`sam`'s gap estimator, its own first): among those longer
  than its time away so far, the share that ends within `h` more; the candidate horizons `h` are
  those remaining parts. No history beyond its time away: no hold.

A returner is a waiting (not suspended: an offload hint says the wait is long) session other than
the candidate's, not in flight, holding device blocks no one references. Candidates that fit
without a returner's blocks are admitted past it (cache-aware's skip rule). `held_until` says when
the hold lapses, for a driver that looks again only on events (the offline replay). The cost is
the engine's prefill time per token, `prefill_s_per_token`; None (the live engine does not set it)
takes no hold: this is `cache-aware`, so the live engine refuses the name (`OFFLINE_ONLY`: serve's
config, `hintkv sim`, `bench swarm_sched`) rather than run it as cache-aware. Without hints the registry knows no sessions: `cache-aware`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from hintkv.cache.sessions import SessionState, session_key
from hintkv.engine.admission import (
    OFFLINE_ONLY,
    CacheAwareAdmission,
    StepPlan,
    blocks_to_end,
    kept_free,
    register_admission,
)

if TYPE_CHECKING:
    from hintkv.cache.manager import KVCacheManager, PrefixMatch
    from hintkv.engine.sequence import Sequence


def best_hold(returners: list[tuple[list[float], float]]) -> float | None:
    """The hold (seconds) that maximizes the expected saving net of the wait,
    sum over returners of P_i(back within it) * saved_i - hold, or None when no hold gains.
    `returners`: per returner, (the remaining parts of its observed gaps that are longer than its
    time away so far: the empirical distribution of its residual wait; the recompute its return
    saves, seconds: its own lost blocks)."""
    best, gain = None, 0.0
    for h in sorted({g for rest, _ in returners for g in rest}):
        v = sum(sum(g <= h for g in rest) / len(rest) * saved for rest, saved in returners if rest) - h
        if v > gain:
            best, gain = h, v
    return best


def lost_blocks(back: list[tuple[list[int], list[float]]], short: int, kv: KVCacheManager) -> list[int]:
    """Per returner, how many of its blocks the `short` blocks the candidate needs take: the
    lowest-ranked first, as the eviction policy picks victims (block class; ties keep order)."""
    order = sorted((kv.ranking.block_class(kv.pool.blocks[b].hash), i)
                   for i, (ids, _) in enumerate(back) for b in ids)
    lost = [0] * len(back)
    for _, i in order[:short]:
        lost[i] += 1
    return lost


OFFLINE_ONLY["cache-aware-serial"] = (
    "its hold weighs a wait against the prefill time per token, which only the replay's time model "
    "sets (replay_offline, bench policy_study); the live engine would run it as plain cache-aware")


@register_admission("cache-aware-serial")
class SerialAdmission(CacheAwareAdmission):
    MUTUAL = True  # count the candidate's context the returner evicts back (`lost_c`)
    SOLE_ONLY = True  # ... only when no one else waits (else the others' admissions evict it anyway)

    def __init__(self, max_skips: int = 16, max_scan: int = 64, max_model_len: int | None = None,
                 prefill_s_per_token: float | None = None) -> None:
        super().__init__(max_skips, max_scan, max_model_len)
        self.prefill_s_per_token = prefill_s_per_token  # the engine's prefill cost; None: no holds
        self.held_until: float | None = None  # set by `room` when it held a candidate for a returner
        self.num_held = 0  # candidates held back (counted once per refusal)
        self.sole = False  # the candidate is the only one waiting (set by `order`)

    def order(self, waiting: Iterable[Sequence], kv: KVCacheManager) -> list[Sequence]:
        self.held_until = None  # a new pass over the candidates
        seqs = list(waiting)
        self.sole = len(seqs) == 1
        return super().order(seqs, kv)

    def room(self, seq: Sequence, match: PrefixMatch, kv: KVCacheManager, plan: StepPlan) -> bool:
        if not super().room(seq, match, kv, plan):
            return False
        if self.prefill_s_per_token is None:
            return True
        back = self.returners(seq, match, kv)
        if not back:
            return True
        blocks = {b for ids, _ in back for b in ids}
        end = blocks_to_end(seq, kv.block_size, self.max_model_len)
        need = max(0, end - match.num_held)
        short = need - (kept_free(plan, match, kv) - len(blocks - plan.kept))
        if short <= 0:
            return True  # fits beside every returner's context
        mutual = self.MUTUAL and (self.sole or not self.SOLE_ONLY)
        cost = kv.block_size * self.prefill_s_per_token
        saved = []
        for (ids, rest), lost_r in zip(back, lost_blocks(back, short, kv)):
            lost_c = max(0, min(end, len(ids) + end - kv.pool.num_blocks)) if mutual and lost_r else 0
            saved.append((rest, (lost_r + lost_c) * cost))
        hold = best_hold(saved)
        if hold is None:
            return True
        self.num_held += 1
        due = kv.ranking.clock() + hold
        self.held_until = due if self.held_until is None else min(self.held_until, due)
        return False

    @staticmethod
    def returners(seq: Sequence, match: PrefixMatch, kv: KVCacheManager) -> list[tuple[list[int], list[float]]]:
        """Per returner other than `seq`'s session with a gap history beyond its time away: (ids of
        its unreferenced device blocks not in `seq`'s match nor an earlier returner's, the remaining
        parts of its observed gaps longer than its time away); only returners with such blocks."""
        reg = kv.ranking.policy.sessions
        if reg is None or not reg.sessions:
            return []
        now = kv.ranking.clock()
        own = session_key(seq.session.tenant, seq.session.session_id) if seq.session is not None else None
        seen = {b.block_id for b in match.blocks}
        back: list[tuple[list[int], list[float]]] = []
        for s in reg.sessions.values():
            if s.state is not SessionState.WAITING or s.num_inflight or not s.held or s.key == own:
                continue
            away = now - s.last_done
            rest = [g - away for g in reg.gap_estimator(s).recent if g > away]
            if not rest:
                continue
            ids = [b.block_id for b in kv.pool.lookup_many(s.held)
                   if b is not None and b.ref_cnt == 0 and b.block_id not in seen]
            seen.update(ids)
            if ids:
                back.append((ids, rest))
        return back
