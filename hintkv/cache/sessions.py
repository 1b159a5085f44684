"""The session registry: which agent sessions exist, their state, and which KV blocks they hold.

Sessions form trees (a sub-agent names its parent; a root names itself) and are namespaced by
tenant, so a hint can only ever reach its own tenant's sessions. State machine:

    (new) --request--> ACTIVE --last request done--> WAITING --request--> ACTIVE
    ACTIVE/WAITING --offload--> SUSPENDED --prefetch/request--> ACTIVE
    any --evict--> ENDED (a root's evict ends its whole tree; a later request revives it)

Ownership: a session holds the full blocks of its latest prompt + completion, by content hash, so
a shared prefix is held by many sessions and stored once. Invariant (`check_integrity`): `holders`
maps each hash to exactly the live sessions whose `held` list contains it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import filterfalse
from typing import TYPE_CHECKING

from hintkv.cache.gaps import GapEstimator
from hintkv.cache.hashing import BlockHash

if TYPE_CHECKING:
    from hintkv.cache.ranking import ClassRanking

PREFETCH_GRACE_S = 30.0  # a prefetched session counts as about to run for this long
# the children of a session that never had any: one shared empty set (a class computation tests
# `s.children` on every request end; a set of its own per session is a cache miss there). A
# session gets a set of its own with its first child (`_ensure`).
NO_CHILDREN: frozenset[str] = frozenset()


class SessionState(enum.Enum):
    ACTIVE = "active"
    WAITING = "waiting"
    SUSPENDED = "suspended"
    ENDED = "ended"


@dataclass(slots=True, eq=False)
class Session:
    key: str
    tenant: str
    session_id: str
    parent: str | None  # key of the parent session; None for a root
    children: set[str] | frozenset[str] = NO_CHILDREN  # keys of its sub-agents
    state: SessionState = SessionState.WAITING
    held: list[BlockHash] = field(default_factory=list)
    num_inflight: int = 0
    num_requests: int = 0
    last_arrival: float = 0.0
    last_done: float = 0.0
    last_tool: str | None = None  # tool of the latest request: the best guess for the next wait
    gaps: GapEstimator = field(default_factory=GapEstimator)
    # `gaps.prediction` once it has two gaps or more (else None): read on every class computation
    # of a waiting session, kept here so that reads no second object (`SessionRegistry.on_arrival`)
    gap_prediction: tuple[float, float] | None = None
    protect_until: float = 0.0  # cache_control.ttl (accepted within the protection budget)
    prefetched_until: float = 0.0
    # queued, and no room opens before this time (the running prefills' estimated end, set by the
    # scheduler, `engine.room_wait`): its next use is no sooner (0.0: not blocked)
    blocked_until: float = 0.0
    # how many of its requests in flight still wait for their first admission: each one's wait is
    # observed once, at its own admission (`SessionRegistry.on_admitted`: a preempted request's
    # second admission is not a new wait), or at an end that leaves fewer in flight (`on_done`)
    queued: int = 0
    # `ClassRanking`'s state of this session, kept on it (a class change reads no other map):
    # the groups of blocks it holds (in the order it joined them: a tuple, one object a class
    # change walks), its class (None: none yet) and its event count (a recheck computed before
    # the latest event is void)
    rank_groups: tuple = ()
    rank_cls: int | None = None
    rank_version: int = 0


def session_key(tenant: str, session_id: str) -> str:
    return f"{tenant}\x1f{session_id}"


class SessionRegistry:
    def __init__(self, protect_budget_blocks: int = 0) -> None:
        self.sessions: dict[str, Session] = {}
        self.holders: dict[BlockHash, set[str]] = {}
        self.tool_gaps: dict[str, GapEstimator] = {}
        self.all_gaps = GapEstimator()
        self.turnaround = GapEstimator()  # arrival -> done of a session's request: queue + run
        self.turnaround_q = 1.0  # predicted_turnaround() (a policy may read it directly: hot path)
        self.wait = GapEstimator()  # arrival -> admission of a session's request: the queue's wait
        self.wait_q = 1.0  # predicted_wait() (read directly on the hot path too)
        self.protect_budget_blocks = protect_budget_blocks
        self.ranking: ClassRanking | None = None  # told of every state and ownership change
        # sessions whose protection may still run (expired ones pruned by set_ttl): the budget
        # check sums over these, never over every session
        self._protected: dict[str, Session] = {}

    def _changed(self, s: Session, now: float | None = None, defer: bool = False) -> None:
        if self.ranking is not None:
            self.ranking.session_changed(s, now, defer)

    # ---- lookup --------------------------------------------------------------------------
    def get(self, tenant: str, session_id: str) -> Session | None:
        return self.sessions.get(session_key(tenant, session_id))

    def _ensure(self, tenant: str, session_id: str, parent_id: str | None) -> Session:
        key = session_key(tenant, session_id)
        s = self.sessions.get(key)
        if s is None:
            pkey = None
            if parent_id is not None and parent_id != session_id:
                pkey = self._ensure(tenant, parent_id, None).key
            s = self.sessions[key] = Session(key, tenant, session_id, pkey)
            if pkey is not None:
                p = self.sessions[pkey]
                if p.children is NO_CHILDREN:
                    p.children = set()
                p.children.add(key)
        return s

    def is_held(self, h: BlockHash) -> bool:
        return h in self.holders

    # ---- request lifecycle ---------------------------------------------------------------
    def on_arrival(self, tenant: str, session_id: str, parent_id: str, now: float,
                   tool: str | None = None) -> Session:
        s = self._ensure(tenant, session_id, parent_id)
        if s.num_requests and s.num_inflight == 0 and s.last_done:
            # the gap just ended was spent running the tool whose result this request carries
            gap = now - s.last_done
            own = s.gaps
            own.observe(gap)
            if own.n >= 2:
                s.gap_prediction = own.prediction
            self.all_gaps.observe(gap)
            if tool:
                self.tool_gaps.setdefault(tool, GapEstimator()).observe(gap)
        s.state = SessionState.ACTIVE
        s.num_inflight += 1
        s.num_requests += 1
        s.last_arrival = now
        s.blocked_until = 0.0
        s.queued += 1
        s.last_tool = tool
        self._changed(s, now, defer=True)  # its own group moves at the next read (`ClassRanking`)
        return s

    def on_admitted(self, key: str, now: float, arrival: float | None = None) -> None:
        """A request of `key` that arrived at `arrival` (None: its latest arrival) left the queue
        for the first time (the scheduler admitted it): its blocks are read now, so `now -
        arrival` is the queue's wait `predicted_wait` learns, the request's own (two requests of
        one session may be in flight: each one's wait is observed once, at its own admission)."""
        s = self.sessions.get(key)
        if s is not None and s.queued:
            s.queued -= 1
            self._observe_wait(now - (s.last_arrival if arrival is None else arrival))

    def _observe_wait(self, wait: float) -> None:
        self.wait.observe(wait)
        self.wait_q = max(self.wait.expected(), 1e-3)

    def on_done(self, key: str, hashes: list[BlockHash], now: float) -> list[BlockHash]:
        """A request finished: the session now holds exactly this prompt + completion's blocks.
        Returns the hashes nobody holds any more (its previous context that was not reused)."""
        s = self.sessions.get(key)
        if s is None:
            return []
        s.num_inflight = max(0, s.num_inflight - 1)
        s.last_done = now
        if s.queued > s.num_inflight:  # this request's admission was never told (an engine that tells
            s.queued = s.num_inflight  # none; the scheduler tells an abort in the queue itself): its
            self._observe_wait(now - s.last_arrival)  # blocks were read by its end at the latest
        if s.num_inflight == 0:
            self.turnaround.observe(now - s.last_arrival)
            self.turnaround_q = max(self.turnaround.expected(), 1e-3)
        if s.state is SessionState.ENDED:
            return []  # evicted while its request ran: hold nothing
        orphans = self._set_held(s, hashes)
        if s.num_inflight == 0 and s.state is SessionState.ACTIVE:
            s.state = SessionState.WAITING
            self._changed(s, now)
        return orphans

    def hold(self, key: str, hashes: list[BlockHash]) -> None:
        """`key` also holds `hashes` (a preempted request's computed blocks) until its request
        ends, without a state change: they are ranked and written down as the session's."""
        s = self.sessions.get(key)
        if s is None or s.state is SessionState.ENDED:
            return
        old = set(s.held)
        self._set_held(s, [*s.held, *(h for h in hashes if h not in old)])

    def _set_held(self, s: Session, hashes: list[BlockHash]) -> list[BlockHash]:
        """Replace what `s` holds; return the hashes nobody holds any more. A request's new
        context usually extends the one before (or an evict cuts it): then only the part past
        the common prefix is diffed (a full-scale prompt is thousands of blocks)."""
        held = s.held
        n_old, n_new = len(held), len(hashes)
        # (the filters run in C: `filterfalse` over a set's membership test)
        if n_new >= n_old and hashes[:n_old] == held:  # extended: nothing is dropped
            removed = []
            added = list(filterfalse(set(held).__contains__, hashes[n_old:])) if n_new > n_old \
                else []
        elif n_new < n_old and held[:n_new] == hashes:  # cut: nothing is added
            removed = list(filterfalse(set(hashes).__contains__, held[n_new:]))
            added = []
        else:
            removed = list(filterfalse(set(hashes).__contains__, held))
            added = list(filterfalse(set(held).__contains__, hashes))
        orphans = []
        holders = self.holders
        key = s.key
        for h in removed:
            owners = holders.get(h)
            if owners is not None:
                owners.discard(key)
                if not owners:
                    del holders[h]
                    orphans.append(h)
        for h in added:
            holders.setdefault(h, set()).add(key)
        s.held = list(hashes)
        if self.ranking is not None and (removed or added):  # (a resumed context: often neither)
            self.ranking.held_changed(s, reversed(removed), reversed(added))
        return orphans

    # ---- hint actions --------------------------------------------------------------------
    def subtree(self, key: str) -> list[Session]:
        out, stack = [], [key]
        while stack:
            s = self.sessions.get(stack.pop())
            if s is not None:
                out.append(s)
                stack.extend(s.children)
        return out

    def end(self, key: str) -> list[BlockHash]:
        """Evict a session (a root: its whole tree). Returns hashes nobody holds any more."""
        s = self.sessions.get(key)
        if s is None:
            return []
        targets = self.subtree(key) if s.parent is None else [s]
        orphans: list[BlockHash] = []
        for t in targets:
            orphans += self._set_held(t, [])
            t.state = SessionState.ENDED
            t.protect_until = t.prefetched_until = 0.0
            self._changed(t)
        return orphans

    def truncate(self, key: str, keep_blocks: int) -> list[BlockHash]:
        """Drop the session's claim on its blocks from index `keep_blocks` on (stale context)."""
        s = self.sessions.get(key)
        if s is None or keep_blocks >= len(s.held):
            return []
        return self._set_held(s, s.held[:keep_blocks])

    def suspend(self, key: str) -> Session | None:
        s = self.sessions.get(key)
        if s is not None and s.state is not SessionState.ENDED:
            s.state = SessionState.SUSPENDED
            # an explicit offload beats cache_control's TTL ("a soft protection, never a hard lock")
            s.prefetched_until = s.protect_until = 0.0
            self._changed(s)
        return s

    def block(self, key: str, until: float, now: float, tolerance: float = 0.0) -> None:
        """`key`'s queued request cannot be admitted before `until` (0.0: it can be now, or it
        was admitted): re-ranked when that moves its predicted next use (`engine.room_wait`),
        not when a wait still ahead moves by at most `tolerance` of what is left of it."""
        s = self.sessions.get(key)
        if s is None or s.state is not SessionState.ACTIVE or s.blocked_until == until:
            return
        old = s.blocked_until
        if old > now and until > now and abs(until - old) <= tolerance * (old - now):
            return
        s.blocked_until = until
        self._changed(s, now)

    def prefetch(self, key: str, now: float) -> Session | None:
        s = self.sessions.get(key)
        if s is not None and s.state is not SessionState.ENDED:
            s.prefetched_until = now + PREFETCH_GRACE_S
            if s.state is SessionState.SUSPENDED:
                s.state = SessionState.WAITING
            self._changed(s, now)
        return s

    def set_ttl(self, key: str, ttl_s: float, now: float) -> bool:
        """Protect a session's blocks for `ttl_s` if the protection budget allows it."""
        s = self.sessions.get(key)
        if s is None:
            return False
        self._protected = {k: o for k, o in self._protected.items()
                           if o.protect_until > now and self.sessions.get(k) is o}
        others = sum(len(o.held) for o in self._protected.values() if o is not s)
        if others + len(s.held) > self.protect_budget_blocks:
            return False
        s.protect_until = now + ttl_s
        self._protected[key] = s
        self._changed(s, now)
        return True

    # ---- prediction (read by the `sam` policy and SAM's resume prefetch) --------------------
    def predicted_gap(self, s: Session) -> tuple[float, float]:
        """(expected gap, gap after which the session is presumed gone) for a waiting session."""
        own = s.gap_prediction
        if own is not None:  # its own history: `gap_estimator`'s first choice, one read
            return own
        est = self.gap_estimator(s)
        return est.prediction if est.n else (5.0, 60.0)

    def gap_estimator(self, s: Session) -> GapEstimator:
        """The best-informed gap history for `s`: its own (two gaps or more), else its last
        tool's, else its own single gap, else everyone's (may be empty: `known` False)."""
        own = s.gaps
        est = own if own.n >= 2 else self.tool_gaps.get(s.last_tool or "", None)
        if est is None or not est.n:  # (`known`, read directly: every class computation)
            est = own if own.n else self.all_gaps
        return est

    def predicted_turnaround(self) -> float:
        """Seconds from a request's arrival to its end, lately (the queue's wait plus the run):
        the time scale a session's next use is ranked on (`sam`'s bands). 1 s until one was seen."""
        return self.turnaround_q  # read per class computation: kept, not derived, on each call

    def predicted_wait(self) -> float:
        """Seconds from a request's arrival to its admission, lately (the queue's wait): how long
        after it asks again a session's blocks are read. Observed where the scheduler tells the
        admission (`on_admitted`), else at the request's end, as the turnaround; 1 s until one
        was seen. Why not the turnaround (issue #9, 100 users): behind 155K-token prefills Q was
        92 s, so a session due back in 0.2 s (r = 92.2 s) shared a band with ones due in a
        minute, and its just-used prefix went first; its blocks are read at its admission, not
        at its end."""
        return self.wait_q

    # ---- introspection -------------------------------------------------------------------
    def check_integrity(self) -> None:
        expect: dict[BlockHash, set[str]] = {}
        for s in self.sessions.values():
            if s.state is SessionState.ENDED:
                assert not s.held, f"ended session {s.session_id} still holds blocks"
            for h in s.held:
                expect.setdefault(h, set()).add(s.key)
            for c in s.children:
                assert self.sessions[c].parent == s.key, "child/parent links disagree"
            assert s.gap_prediction == (s.gaps.prediction if s.gaps.n >= 2 else None), \
                f"session {s.session_id}'s kept gap prediction is stale"
        assert expect == self.holders, "holders map out of sync with sessions' held lists"
        if self.ranking is not None:
            self.ranking.check_integrity(self.sessions)

    def live(self) -> Iterable[Session]:
        return (s for s in self.sessions.values() if s.state is not SessionState.ENDED)

    def forget(self, key: str) -> list[BlockHash]:
        """Drop a session the registry no longer needs to remember (see `session_bounds`): its
        claims go (returned: hashes nobody holds any more) and so does the session itself. Only
        a leaf with no request in flight can be forgotten; otherwise nothing changes."""
        s = self.sessions.get(key)
        if s is None or s.children or s.num_inflight:
            return []
        orphans = self._set_held(s, [])
        del self.sessions[key]
        if self.ranking is not None:
            self.ranking.forget(key)
        if s.parent is not None and s.parent in self.sessions:
            self.sessions[s.parent].children.discard(key)
        return orphans
