"""Per-group nodes in the device pool, against a naive reference ordering (no buckets).

The reference recomputes from the registry alone, after every random op: a cached block's group
is the SET of sessions holding it (not the ranking's Zobrist id), its class the highest policy
class among them; a group is stamped with the op that last filed a block into it or changed its
class, a block with the op that filed it (negated when it joined a held group while cached: the
pool files those at the group's front, tail before head). The pool's victim order must be sorted by (class, group
stamp), each group one contiguous run, its blocks in block stamp order; and a session changing class must move
its blocks as one node (one class change reported, whatever its number of blocks).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy, policy_names
from hintkv.cache.sessions import SessionRegistry

NUM_BLOCKS = 14
SESSIONS = ["a", "b", "c"]

_ops = st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 3), st.integers(0, 11)),
    st.tuples(st.just("release"), st.integers(0, 7), st.integers(0, 0)),
    st.tuples(st.just("arrive"), st.sampled_from(SESSIONS), st.integers(0, 0)),
    st.tuples(st.just("done"), st.sampled_from(SESSIONS), st.sampled_from([0, 2, 4, 8])),
    st.tuples(st.just("suspend"), st.sampled_from(SESSIONS), st.integers(0, 0)),
    st.tuples(st.just("prefetch"), st.sampled_from(SESSIONS), st.integers(0, 0)),
    st.tuples(st.just("end"), st.sampled_from(SESSIONS), st.integers(0, 0)),
    st.tuples(st.just("tick"), st.integers(1, 120), st.integers(0, 0)),
)


class Reference:
    """Stamps kept from the registry and the pool's public state only."""

    def __init__(self, kv, sessions, grouped: bool) -> None:
        self.kv, self.sessions, self.grouped = kv, sessions, grouped
        self.block: dict[int, tuple[frozenset, int]] = {}  # cached block id -> (group, stamp)
        self.group_stamp: dict[frozenset, int] = {}
        self.group_cls: dict[frozenset, int] = {}

    def group(self, h) -> frozenset:
        return frozenset(self.sessions.holders.get(h, ())) if self.grouped else frozenset()

    def cls(self, g: frozenset) -> int:
        return max((self.kv.ranking.session_class(k) for k in g), default=0)

    def after(self, op: int) -> None:
        for g in list(self.group_cls):
            if self.cls(g) != self.group_cls[g]:
                self.group_stamp[g] = op
                self.group_cls[g] = self.cls(g)
        cached = {b.block_id: b for b in self.kv.pool.blocks if b.ref_cnt == 0 and b.hash}
        for bid in list(self.block):
            if bid not in cached:
                del self.block[bid]
        for bid, b in cached.items():
            g = self.group(b.hash)
            was = self.block.get(bid)
            if was is None or was[0] != g:
                # released: at the back of its group; regrouped while cached (a session's held
                # list grew or shrank): at the front of a held group (tail before head)
                front = was is not None and g and self.grouped
                self.block[bid] = (g, -op if front else op)
                self.group_stamp[g] = op
                self.group_cls[g] = self.cls(g)

    def check(self, op: int) -> None:
        victims = self.kv.pool.choose_victims(self.kv.pool.num_cached_free)
        assert {b.block_id for b in victims} == set(self.block)
        keys = []
        for b in victims:
            g, stamp = self.block[b.block_id]
            keys.append((self.cls(g), self.group_stamp[g], g, stamp))
        order = [k[:2] for k in keys]
        assert order == sorted(order), f"op {op}: groups out of reference order: {keys}"
        runs: list[list] = []  # one run per group, in victim order
        for k in keys:
            if runs and runs[-1][0][2] == k[2]:
                runs[-1].append(k)
            else:
                runs.append([k])
        assert len(runs) == len({k[2] for k in keys}), f"op {op}: a group is split: {keys}"
        for run in runs:
            stamps = [k[3] for k in run]
            assert stamps == sorted(stamps), f"op {op}: a group's blocks out of order: {keys}"

@pytest.mark.parametrize("name", policy_names())
@settings(max_examples=80, deadline=None)
@given(ops=st.lists(_ops, max_size=40))
def test_pool_order_matches_reference(name, ops):
    sessions = SessionRegistry(protect_budget_blocks=NUM_BLOCKS)
    kv = KVCacheManager(NUM_BLOCKS, 4, make_policy(name, sessions=sessions))
    pool = kv.pool
    ref = Reference(kv, sessions, kv.ranking.grouped)
    held: list[list] = []
    now = 1000.0
    kv.ranking.clock = lambda: now
    for j, key in enumerate(SESSIONS):  # every session waits, holding a window of its own
        sessions.on_done(sessions.on_arrival("t", key, key, now).key,
                         [b"h%d" % k for k in range(4 * j, 4 * j + 4)], now)
    ref.after(0)
    for i, (op, a, b) in enumerate(ops, start=1):
        s = sessions.get("t", a) if isinstance(a, str) else None
        if op == "alloc" and pool.can_allocate(a):
            blocks = pool.allocate(a)
            for j, blk in enumerate(blocks):
                pool.register(blk, b"h%d" % (b + j))
            held.append(blocks)
        elif op == "release" and held:
            pool.release(held.pop(a % len(held)))
        elif op == "arrive":
            sessions.on_arrival("t", a, a, now)
        elif op == "done" and s is not None:
            sessions.on_done(s.key, [b"h%d" % j for j in range(b, b + 4)], now)
        elif op == "suspend" and s is not None:
            sessions.suspend(s.key)
        elif op == "prefetch" and s is not None:
            sessions.prefetch(s.key, now)
        elif op == "end" and s is not None:
            for h in sessions.end(s.key):
                blk = pool.lookup(h)
                if blk is not None:
                    pool.drop(blk)
        elif op == "tick":
            now += a
            kv.ranking.tick(now, sessions.sessions)
        ref.after(i)
        kv.check_integrity()
        sessions.check_integrity()
        ref.check(i)


def test_a_release_makes_its_group_the_newest_of_its_class():
    sessions = SessionRegistry()
    kv = KVCacheManager(NUM_BLOCKS, 4, make_policy("sam", sessions=sessions))
    for key, first in (("a", 0), ("b", 5)):
        s = sessions.on_arrival("t", key, key, 1000.0)
        sessions.on_done(s.key, [b"h%d" % j for j in range(first, first + 4)], 1000.0)
    assert kv.ranking.session_class("t\x1fa") == kv.ranking.session_class("t\x1fb")
    for h in (b"h0", b"h5", b"h1"):  # a's group, b's group, a's group again
        (blk,) = kv.pool.allocate(1)
        kv.pool.register(blk, h)
        kv.pool.release([blk])
    kv.check_integrity()
    assert [b.hash for b in kv.pool.choose_victims(3)] == [b"h5", b"h0", b"h1"]


def test_a_state_change_moves_one_node_whatever_the_size():
    sessions = SessionRegistry()
    kv = KVCacheManager(300, 4, make_policy("sam", sessions=sessions))
    pool, now = kv.pool, 50.0
    kv.ranking.clock = lambda: now
    shared = [b"sys%d" % i for i in range(20)]
    for name, n in (("a", 200), ("b", 50)):
        own = [b"%s%d" % (name.encode(), i) for i in range(n)]
        s = sessions.on_arrival("t", name, name, now)
        blocks = pool.allocate(len(shared) + n) if name == "a" else pool.allocate(n)
        for blk, h in zip(blocks, (shared + own) if name == "a" else own):
            pool.register(blk, h)
        sessions.on_done(s.key, shared + own, now)
        pool.release(blocks)
    kv.check_integrity()
    sessions.check_integrity()
    before = kv.ranking.num_moves
    sessions.on_arrival("t", "a", "a", now)  # a runs again: its 200 own blocks + the shared 20
    kv.ranking.settle()  # (an arrival's moves wait for the next read)
    assert kv.ranking.num_moves - before <= 2, "a state change moved blocks one by one"
    kv.check_integrity()
    victims = pool.choose_victims(50)
    assert {v.hash for v in victims} == {b"b%d" % i for i in range(50)}, \
        "the waiting session's blocks go before the running one's"
    assert [v.hash for v in victims] == [b"b%d" % i for i in range(49, -1, -1)], \
        "inside a session, tail before head"
