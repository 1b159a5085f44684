"""SAM, the session-aware manager: applies Agent Hint edits and request lifecycles to the cache.

It joins the session registry (who holds what) and the KV manager (where blocks are). Once per
engine step `on_step(now)` re-ranks sessions whose predicted return came closer (`ranking.tick`)
and, with lower tiers, prefetches waiting sessions predicted back soon (SAM owns that decision;
the tier connector only moves the blocks). Evicting
releases the blocks nobody holds any more: on the device they are the first to be reclaimed (the
lowest class) but stay matchable until their room is taken, so a later prompt that shares them
(another task's same system prompt and tools) still hits; on lower tiers, whose bytes are the
cost, they are removed at once. Offload and prefetch change how the policy
ranks a session's blocks and, with lower tiers (`kv.tiers`), move them: offload writes the
session's device blocks down (their device copies go once the writes land), prefetch brings its
host/disk blocks up into room that running sessions do not need. Everything here runs under the
engine's state lock, so it is consistent with the scheduler, and none of it can make inference fail.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable

from hintkv.cache.hashing import BlockHash
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.resume_prefetch import make_resume_prefetch
from hintkv.cache.sessions import Session, SessionRegistry, SessionState, session_key
from hintkv.cache.types import CacheEdit, EditOutcome, SessionDescription, SessionRef

PREDICT_LEAD_S = 1.0  # prefetch this long (plus the load estimate) before the predicted arrival
# Held blocks SAM may examine for predicted prefetches in one engine step (at least one session
# a step): bounds the step's bookkeeping when many sessions come due at once (~0.3 us a block
# examined); the others stay due and go on the next steps, still ahead of their predicted return.
PREDICT_BUDGET_BLOCKS = 1024
# Clock-driven re-ranks (due rechecks) applied in one engine step: sessions whose rechecks come
# due together (a burst of request ends, then their periodic rechecks in step) are spread over
# the next steps instead of one long step (~20 us a re-rank: 601 at once took 12 ms in
# `bench cache`). Events (arrival, end, hints) are never deferred: only the clock's drift is.
RERANK_BUDGET = 32
RESUME_PREFETCH = "once"  # `cache.resume_prefetch` (`watch`: opt-in, measured worse live)


class SessionAwareManager:
    def __init__(self, kv: KVCacheManager, sessions: SessionRegistry,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kv = kv
        self.sessions = sessions
        self.clock = clock  # injectable: a simulator drives SAM under a virtual clock
        kv.ranking.clock = clock  # re-ranking on events that carry no time uses the same clock
        self.predict_resume = True  # prefetch waiting sessions whose return is predicted soon
        self.predict_budget_blocks = PREDICT_BUDGET_BLOCKS  # per step
        self.resume = make_resume_prefetch(RESUME_PREFETCH)  # what follows a predicted prefetch
        self.rerank_budget = RERANK_BUDGET  # per step
        self.num_predicted_prefetches = 0
        # (when to prefetch, session key, the last_done it was predicted from): one entry per
        # request end, popped when due, so a step costs O(due sessions), not O(live sessions)
        self._resumes: list[tuple[float, str, float]] = []
        # (predicted next call, session key, the last_done it was predicted from): `next_return`'s,
        # kept only for a scheduler that reads it (`track_returns`)
        self._returns: list[tuple[float, str, float]] = []
        self.track_returns = False

    # ---- once per engine step --------------------------------------------------------------
    def on_step(self, now: float | None = None) -> None:
        """Re-rank sessions whose class moved with the clock; prefetch predicted resumes."""
        now = self.clock() if now is None else now
        self.kv.ranking.tick(now, self.sessions.sessions, self.rerank_budget)
        if self.kv.tiers is not None and self.predict_resume:
            self.predict(now)

    def next_due(self) -> float:
        """The earliest time at which `on_step` acts (a session's recheck, a predicted resume or
        the resume policy's next look; math.inf: nothing scheduled): steps starting before it
        change nothing here."""
        due = self.kv.ranking.next_recheck()
        if self.kv.tiers is not None and self.predict_resume:
            if self._resumes:
                due = min(due, self._resumes[0][0])
            due = min(due, self.resume.next_due())
        return due

    def predict(self, now: float) -> int:
        """Prefetch the waiting sessions whose predicted return is within the lead time, then
        let the resume policy look again at those it watches (`cache.resume_prefetch`), up to
        the step's budget of held blocks examined. Returns the blocks examined."""
        tiers = self.kv.tiers
        examined = 0
        budget = self.predict_budget_blocks
        while tiers is not None and self._resumes and self._resumes[0][0] <= now and examined < budget:
            _, key, last_done = heapq.heappop(self._resumes)
            s = self.away(key, last_done, now)
            if s is None:
                continue
            examined += len(s.held)
            self.resume.came_due(key, last_done, self.prefetch_ahead(s))
        if tiers is not None and examined < budget:
            examined += self.resume.step(self, now, budget - examined)
        return examined

    def away(self, key: str, last_done: float, now: float) -> Session | None:
        """Session `key` if it is still away since `last_done` with blocks to bring back: waiting
        on its tool, not back, not ended or suspended since, not presumed gone."""
        s = self.sessions.sessions.get(key)
        if s is None or s.last_done != last_done or s.state is not SessionState.WAITING \
                or not s.held or s.num_inflight:
            return None
        if now - s.last_done > self.sessions.predicted_gap(s)[1]:
            return None  # presumed gone
        return s

    def prefetch_ahead(self, s: Session) -> bool:
        """Prefetch what of `s` only lower tiers hold, into room below its own blocks; True:
        all of it is on the device or on its way (nothing left for a later look)."""
        tiers = self.kv.tiers
        scheduled, on_device = tiers.prefetch(s.held, s.rank_cls)
        if scheduled:
            self.num_predicted_prefetches += 1
            tiers.counters.num_predicted_prefetches += 1
        return scheduled + on_device >= len(s.held)

    def next_return(self, now: float) -> float:
        """When the earliest session away on its tool is predicted to call again (its last end plus
        its predicted gap: the hints' session and tool history), not before `now`; math.inf: none
        (a session past its prediction, back, ended or presumed gone no longer counts)."""
        heap = self._returns
        while heap:
            at, key, last_done = heap[0]
            s = self.sessions.sessions.get(key)
            if at >= now and s is not None and s.last_done == last_done and s.state is SessionState.WAITING \
                    and not s.num_inflight:
                return at
            heapq.heappop(heap)
        return math.inf

    def catch_up(self, now: float) -> None:
        """Run `predict` until no predicted resume is due (a caller replaying history)."""
        while self.kv.tiers is not None and self._resumes and self._resumes[0][0] <= now:
            self.predict(now)

    def _schedule_resume(self, key: str) -> None:
        s = self.sessions.sessions.get(key)
        tiers = self.kv.tiers
        if tiers is None or s is None or s.state is not SessionState.WAITING or not s.held:
            return
        expected, _ = self.sessions.predicted_gap(s)
        lead = PREDICT_LEAD_S + len(s.held) * tiers.costs.load_s("disk")
        heapq.heappush(self._resumes, (s.last_done + expected - lead, key, s.last_done))

    # ---- request lifecycle ---------------------------------------------------------------
    def on_arrival(self, ref: SessionRef, tool: str | None = None) -> str:
        now = self.clock()
        s = self.sessions.on_arrival(ref.tenant, ref.session_id, ref.parent_session_id, now, tool)
        if ref.ttl_s:
            self.sessions.set_ttl(s.key, ref.ttl_s, now)
        return s.key

    def on_done(self, key: str, hashes: list[BlockHash]) -> None:
        orphans = self.sessions.on_done(key, hashes, self.clock())
        if self.kv.tiers is not None:
            if orphans:
                self.kv.tiers.remove_below(orphans)  # device copies stay cached (first to go)
            self.kv.tiers.publish_to_pool(hashes)  # write-through to the shared pool, if any
        if self.predict_resume:
            self._schedule_resume(key)
        s = self.sessions.sessions.get(key) if self.track_returns else None
        if s is not None and s.state is SessionState.WAITING:
            heapq.heappush(self._returns, (s.last_done + self.sessions.predicted_gap(s)[0], key, s.last_done))

    # ---- edits ---------------------------------------------------------------------------
    def apply(self, ref: SessionRef, edit: CacheEdit) -> EditOutcome:
        key = session_key(ref.tenant, ref.session_id)
        s = self.sessions.sessions.get(key)
        if s is None:
            return EditOutcome("none", reason="unknown_session")
        if ref.ttl_s and edit.action == "prefetch":  # a management request's cache_control, as an arrival's
            self.sessions.set_ttl(key, ref.ttl_s, self.clock())
        if edit.action == "evict":
            return self._evict(key, edit.token_start)
        # a range edit acts on the session's KV from its first stale token's block on; only a
        # whole-session offload suspends the session (a range one leaves it as it is)
        part = s.held if edit.token_start is None else s.held[edit.token_start // self.kv.block_size:]
        if edit.action == "offload":
            if edit.token_start is None:
                self.sessions.suspend(key)
            return self._offload(part, write_now=edit.token_start is not None)
        self.sessions.prefetch(key, self.clock())
        return self._prefetch(part)

    def _offload(self, held: list[BlockHash], write_now: bool = False) -> EditOutcome:
        tiers = self.kv.tiers
        if tiers is None:
            n = self._device_blocks(held)
            return EditOutcome("offloaded", {"device": (0, 0)}, num_held=len(held), num_on_device=n)
        written, below, n = tiers.offload_counted(held, write_now)
        bs = self.kv.block_size
        top = tiers.stack.tiers[0].name
        return EditOutcome("offloaded", {"device": (-(written + below), -(written + below) * bs),
                                         top: (written, written * bs)},
                           lower_tier=top, num_held=len(held), num_on_device=n, num_below=below,
                           num_scheduled=written,
                           offload_mode="lazy" if write_now and tiers.offload_mode == "deferred"
                           else tiers.offload_mode, range_edit=write_now)

    def _prefetch(self, held: list[BlockHash]) -> EditOutcome:
        tiers = self.kv.tiers
        if tiers is None:
            n = self._device_blocks(held)
            return EditOutcome("prefetched", {"device": (0, 0)}, num_held=len(held), num_on_device=n)
        scheduled, on_device, below = tiers.prefetch_counted(held)
        bs = self.kv.block_size
        return EditOutcome("prefetched", {"device": (scheduled, scheduled * bs)},
                           lower_tier=tiers.stack.tiers[0].name, num_held=len(held),
                           num_on_device=on_device, num_below=below, num_scheduled=scheduled)

    def _evict(self, key: str, token_start: int | None) -> EditOutcome:
        if token_start is None:
            orphans = self.sessions.end(key)
        else:
            orphans = self.sessions.truncate(key, token_start // self.kv.block_size)
        # released, not dropped: nobody holds them, so they are reclaimed first (class UNHELD);
        # counted as those reclaimable now (cached, no running request uses them)
        freed = sum(1 for b in self.kv.pool.lookup_many(orphans) if b is not None and b.ref_cnt == 0)
        bs = self.kv.block_size
        tiers = {"device": (-freed, -freed * bs)}
        removed = self.kv.tiers.remove_below(orphans) if self.kv.tiers is not None else {}
        for name, n in removed.items():
            tiers[name] = (-n, -n * bs)
        gone = freed + sum(removed.values())
        return EditOutcome("evicted" if orphans or token_start is None else "none", tiers,
                           num_not_freed=max(0, len(orphans) - gone))

    def _device_blocks(self, hashes: list[BlockHash]) -> int:
        return sum(1 for b in self.kv.pool.lookup_many(hashes) if b is not None)

    # ---- introspection -------------------------------------------------------------------
    def describe(self, tenant: str, session_id: str) -> SessionDescription | None:
        s = self.sessions.get(tenant, session_id)
        if s is None:
            return None
        bs = self.kv.block_size
        now = self.clock()
        parent = self.sessions.sessions[s.parent].session_id if s.parent else s.session_id
        return SessionDescription(
            session_id=s.session_id,
            parent_session_id=parent,
            state=s.state.value,
            num_requests=s.num_requests,
            num_inflight=s.num_inflight,
            held_tokens=len(s.held) * bs,
            tokens_per_tier=({t: n * bs for t, n in self.kv.tiers.where(s.held).items()}
                             if self.kv.tiers is not None
                             else {"device": self._device_blocks(s.held) * bs}),
            children=sorted(self.sessions.sessions[c].session_id for c in s.children),
            predicted_gap_s=round(self.sessions.predicted_gap(s)[0], 3)
            if s.state is SessionState.WAITING else None,
            protect_left_s=round(s.protect_until - now, 3) if s.protect_until > now else None,
        )
