"""Session classes -> groups of blocks -> block classes, kept up to date by events.

The eviction policy puts each live session into a class (`EvictionPolicy.session_class`). Blocks
are GROUPED by the set of live sessions holding them: one session's own context is one group, a
prefix it shares with others another. A block's class is its group's: the highest class among
the group's holders, kept from per-class holder counts. So:

    session event (arrival, done, hint, TTL)  ─▶ session_changed(s): O(groups s is in), usually
    a predicted return coming closer          ─▶ tick(now): due rechecks (`cache.rechecks`)   1-3
    held list replaced (request done, evict)  ─▶ held_changed(s, removed, added): O(changed blocks)

A group's id is the XOR of random 64-bit tokens of its holders (Zobrist hashing): adding or
removing a holder is one XOR, so a block's new group is found in O(1); 0 is "nobody holds it"
(`UNHELD`). Creating or dropping a group costs O(its holders), once.

Listeners (the device pool) hear `block_moved(h, group, cls)` when a block enters another group
(head first, so a pool filing each at the front of its group keeps the group tail first); a
group's class change moves its node in `node_order` (the pool's `BlockRuns`: one node per group
in its class's bucket, linked to it, `Group.node`): one node per session's state change, none for
a group without cached device blocks. The changes are also gathered in a delta the engine
publishes to the tiers once per step (`take_delta`, a `tiers.ranks.RankDelta`). Runs on the
engine thread, under its state lock, like the registry it follows.

An arrival (`session_changed(..., defer=True)`) computes the session's class at once and leaves
its groups' counts and nodes as they were: the moves are pending until something reads or
changes the ranking (`settle`: the pool's next victim choice, release or count, any class query,
a regrouping, the delta, another session's class change) or the same session changes class
again, which then moves its groups once for both (a request that ends before anything reads the
order pays one walk over its groups, not two; the arrival itself touches none of them). Exact:
`_settle` replays the changes' arithmetic and re-files each group whose class moved at any of
them, in the order of its last move, so classes, node order, delta and move counts are what
one eager walk per change gives (tests/cache/test_lazy_ranking.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, KeysView, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from hintkv.cache.group_walk import Group as _Group
from hintkv.cache.group_walk import NodeOrder, settle_changes
from hintkv.cache.hashing import BlockHash
from hintkv.cache.policies.base import UNHELD, EvictionPolicy
from hintkv.cache.ranking_check import check_ranking
from hintkv.cache.rechecks import Rechecks
from hintkv.tiers.ranks import UNHELD_GROUP, RankDelta

if TYPE_CHECKING:
    from hintkv.cache.sessions import Session


_NO_CHANGE = RankDelta(MappingProxyType({}), MappingProxyType({}))  # frozen: shared safely


class ClassListener(Protocol):
    def block_moved(self, h: BlockHash, group: int, cls: int) -> None: ...


class ClassRanking:
    # what a session's event reads (`session_changed`, `settle`) sits in the object itself, in one
    # record of slots (the rest in its `__dict__`: read on regrouping, ticks and queries)
    __slots__ = ("grouped", "policy", "_pending", "_unscheduled", "_delta_groups", "node_order",
                 "num_moves", "clock", "__dict__", "__weakref__")

    def __init__(self, policy: EvictionPolicy, seed: int = 0x5A11) -> None:
        self.policy = policy
        self.num_classes = policy.num_classes
        self.grouped = policy.uses_sessions  # False: every class is 0; pool and tiers stay LRU
        self._token: dict[str, int] = {}  # session key -> its random 64-bit token
        self._rng = random.Random(seed)
        self._group_of: dict[BlockHash, int] = {}  # held hash -> its group id
        self._groups: dict[int, _Group] = {}
        # session key -> the session, for each session that has held blocks (a new group is
        # added to each holder's `rank_groups`, a dropped one taken out)
        self._holder: dict[str, Session] = {}
        self._delta_blocks: dict[BlockHash, int | None] = {}
        self._delta_groups: dict[int, int | None] = {}
        # when each session's class is computed again without an event; an event files the
        # session in `_unscheduled` (the rechecks' own dict), its recheck computed at the tick
        self._rechecks = Rechecks(policy)
        self._unscheduled = self._rechecks.unscheduled
        # (session, its classes since its groups were last moved: old, ..., now): an
        # arrival's moves, pending until the next read or change (`settle`); one session at most
        self._pending: tuple[Session, list[int]] | None = None
        self.lazy = True  # False: an arrival moves its groups at once (the reference tests compare)
        self.listeners: list[ClassListener] = []
        # the device pool's `BlockRuns` (one only: it links each group to its node, `Group.node`): a
        # group's class change moves its node there directly (`move_node`, again: also when back in
        # its class); a group with no node there (no cached device blocks) is not handed at all
        self.node_order: NodeOrder | None = None
        self.num_moves = 0  # class changes reported (of a regrouped block or of a whole group)
        self.clock: Callable[[], float] = time.monotonic  # for events that carry no time
        if policy.sessions is not None:
            policy.sessions.ranking = self

    # ---- queries ---------------------------------------------------------------------------
    def block_class(self, h: BlockHash | None) -> int:
        if self._pending is not None:
            self._settle()
        g = self._group_of.get(h) if h is not None else None
        return UNHELD if g is None else self._groups[g].top

    def group_of(self, h: BlockHash) -> int:
        return self._group_of.get(h, UNHELD_GROUP)

    def group(self, group: int) -> _Group | None:
        """Group `group` (None: no such group), its class current."""
        if self._pending is not None:
            self._settle()
        return self._groups.get(group)

    def group_class(self, group: int) -> int:
        if self._pending is not None:
            self._settle()
        g = self._groups.get(group)
        return UNHELD if g is None else g.top

    def is_held(self, h: BlockHash) -> bool:
        return h in self._group_of

    def groups(self) -> Iterable[_Group]:
        """Every group (a live view, for integrity checks)."""
        return self._groups.values()

    def held(self) -> KeysView[BlockHash]:
        """Every held hash (a live view: read it on the engine thread, do not keep it)."""
        return self._group_of.keys()

    def num_holders(self, h: BlockHash) -> int:
        """Live sessions holding `h` (0: nobody)."""
        g = self._group_of.get(h)
        return 0 if g is None else len(self._groups[g].holders)

    def session_class(self, key: str) -> int | None:
        reg = self.policy.sessions
        s = reg.sessions.get(key) if reg is not None else None
        return None if s is None else s.rank_cls

    def snapshot(self) -> dict[BlockHash, int]:
        """Every held hash and its class."""
        self.settle()
        return {h: self._groups[g].top for h, g in self._group_of.items()}

    def full_delta(self) -> RankDelta:
        """Everything as one delta (for a tier board joining late)."""
        self.settle()
        return RankDelta(dict(self._group_of), {g: grp.top for g, grp in self._groups.items()})

    def take_delta(self) -> RankDelta:
        """Changes since the last call, frozen: regrouped blocks and re-classed groups."""
        self.settle()
        if not (self._delta_blocks or self._delta_groups):
            return _NO_CHANGE  # most steps (the simulator's polls: 22 us each building one)
        blocks, self._delta_blocks = self._delta_blocks, {}
        groups, self._delta_groups = self._delta_groups, {}
        return RankDelta(MappingProxyType(blocks), MappingProxyType(groups))

    # ---- events (from SessionRegistry) -----------------------------------------------------
    def session_changed(self, s: Session, now: float | None = None, defer: bool = False) -> None:
        """`s` changed (state, hint, TTL, the clock): its class now, its groups' counts and
        nodes. `defer` (an arrival): the groups' moves wait for `settle`."""
        if now is None:
            now = self.clock()
        s.rank_version += 1  # older rechecks are void
        if not self.grouped:
            s.rank_cls = UNHELD
            return
        old = s.rank_cls
        new = s.rank_cls = self.policy.session_class(s, now)
        if old is not None and new != old:
            pending = self._pending
            if pending is None:
                chain = [old, new]
            elif pending[0] is s:  # its arrival's moves, still pending: one walk for both
                chain = pending[1]
                chain.append(new)
            else:
                self._settle()  # another session's moves came first
                chain = [old, new]
            if defer and self.lazy:
                self._pending = (s, chain)
            else:  # walked now (`_settle`, without filing the chain as pending first)
                self._pending = None
                self.num_moves += settle_changes(s.rank_groups, chain,
                                                 self._delta_groups, self.node_order)
        self._unscheduled[s.key] = (s, now)  # its recheck is computed at the next tick

    def settle(self) -> None:
        """Apply the pending class changes (an arrival's), if any: what eager moves give."""
        if self._pending is not None:
            self._settle()

    def _settle(self) -> None:
        """The pending session's class changes, in order (old, c1, ..., now), applied to its
        groups as one walk with the result of one walk per change: each group's counts and
        class as after the last, the groups whose class moved at some change re-filed at the
        back of their class in the order of their last move (then tail first), and the delta
        entries added in the order of their first. Nothing else read or changed them since
        the first of these changes (every read and every other session's change settles
        first), so the order is exactly the eager one."""
        s, chain = self._pending
        self._pending = None
        self.num_moves += settle_changes(s.rank_groups, chain, self._delta_groups,
                                         self.node_order)

    def held_changed(self, s: Session, removed: Iterable[BlockHash],
                     added: Iterable[BlockHash]) -> None:
        if self._pending is not None:
            self._settle()  # groups are about to change: their counts must be current
        c = s.rank_cls
        if c is None:
            c = s.rank_cls = (self.policy.session_class(s, self.clock())
                              if self.policy.uses_sessions else UNHELD)
        token = self._token.get(s.key)
        if token is None:
            token = self._token[s.key] = self._rng.getrandbits(64) | 1
        mine = self._holder.setdefault(s.key, s)
        assert mine is s, "two sessions under one key hold blocks"
        # head first: the pool files each regrouped block at the FRONT of its new group, so the
        # group ends up tail first (the registry hands them tail first)
        for h in reversed(list(removed)):
            self._regroup(h, s.key, token, c, joining=False)
        for h in reversed(list(added)):
            self._regroup(h, s.key, token, c, joining=True)

    def forget(self, key: str) -> None:
        """A session that holds nothing and is gone for good."""
        if self._pending is not None:
            self._settle()
        self._unscheduled.pop(key, None)
        s = self._holder.get(key)
        if s is None or not s.rank_groups:
            self._holder.pop(key, None)
            self._token.pop(key, None)

    def tick(self, now: float, sessions: Mapping[str, Session], budget: int | None = None) -> int:
        """Re-rank sessions whose recheck is due (a predicted return came closer, a TTL ran
        out), at most `budget` of them (the rest stay due: the next tick). Returns how many
        were re-ranked."""
        n = 0
        for s in self._rechecks.due(now, sessions, budget):
            self.session_changed(s, now)
            n += 1
        return n

    def next_recheck(self) -> float:
        """The earliest time at which `tick` re-ranks a session (`Rechecks.next_due`). A read
        only: a driver may skip the ticks before it (the simulator's decode stretches)."""
        return self._rechecks.next_due()

    # ---- internals -------------------------------------------------------------------------
    def _regroup(self, h: BlockHash, key: str, token: int, cls: int, joining: bool) -> None:
        """Session `key` (class `cls`) starts or stops holding `h`: `h` changes group."""
        old = self._group_of.get(h, UNHELD_GROUP)
        new = old ^ token
        g_old = self._groups.get(old)
        g_new = self._groups.get(new)
        if new != UNHELD_GROUP and g_new is None:
            if joining:
                holders = (g_old.holders if g_old else frozenset()) | {key}
            else:
                holders = g_old.holders - {key}
            counts = list(g_old.counts) if g_old else [0] * self.num_classes
            counts[cls] += 1 if joining else -1
            g_new = self._groups[new] = _Group(new, max(c for c, n in enumerate(counts) if n),
                                               counts, holders)
            holder = self._holder
            for k in holders:
                hs = holder[k]
                hs.rank_groups = (*hs.rank_groups, g_new)
            self._delta_groups[new] = g_new.top
        assert g_new is None or (key in g_new.holders) == joining, "group id collision"
        if g_old is not None:
            g_old.num_blocks -= 1
            if not g_old.num_blocks:
                self._drop_group(old, g_old)
        if g_new is None:
            del self._group_of[h]
            self._delta_blocks[h] = None
        else:
            g_new.num_blocks += 1
            self._group_of[h] = new
            self._delta_blocks[h] = new
        before = g_old.top if g_old is not None else UNHELD
        after = g_new.top if g_new is not None else UNHELD
        if after != before:
            self.num_moves += 1
        for listener in self.listeners:
            listener.block_moved(h, new, after)

    def _drop_group(self, gid: int, g: _Group) -> None:
        del self._groups[gid]
        holder = self._holder
        for k in g.holders:
            hs = holder[k]
            hs.rank_groups = tuple([x for x in hs.rank_groups if x is not g])
        self._delta_groups[gid] = None

    def check_integrity(self, sessions: Mapping[str, Session]) -> None:
        check_ranking(self, sessions)
