"""An arrival's group moves wait for the next read (`ClassRanking.settle`): lazy against eager.

Two identical caches run the same random ops (arrivals, request ends, hints, clock ticks, blocks
placed and allocated, evicts); one defers each arrival's group moves, the other moves at once
(`ClassRanking.lazy = False`). At random points, and at the end, everything a reader can see must
be identical: the victim order (block ids and hashes), every held block's class, the delta the
tiers get (contents and order), the number of moves, the groups' nodes and counts
(`check_integrity`).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy, policy_names
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.types import CacheEdit, SessionRef

NUM_BLOCKS = 24
SESSIONS = ["a", "b", "c", "d"]
PARENT = {"a": "a", "b": "a", "c": "a", "d": "d"}  # b and c are a's sub-agents
SHARED = [b"sys%d" % i for i in range(4)]

_ops = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(SESSIONS), st.integers(0, 0)),
    st.tuples(st.just("done"), st.sampled_from(SESSIONS), st.integers(0, 6)),
    st.tuples(st.just("place"), st.sampled_from(SESSIONS), st.integers(0, 6)),
    st.tuples(st.just("alloc"), st.integers(1, 6), st.integers(0, 0)),
    st.tuples(st.just("ttl"), st.sampled_from(SESSIONS), st.integers(1, 30)),
    st.tuples(st.just("edit"), st.sampled_from(SESSIONS), st.sampled_from(["offload", "prefetch", "evict"])),
    st.tuples(st.just("tick"), st.integers(1, 90), st.integers(0, 0)),
    st.tuples(st.just("check"), st.integers(0, 0), st.integers(0, 0)),
    st.tuples(st.just("peek"), st.integers(1, 8), st.integers(0, 12)),
)


class Cache:
    def __init__(self, policy: str, lazy: bool) -> None:
        self.now = 1000.0
        self.sessions = SessionRegistry(protect_budget_blocks=NUM_BLOCKS // 2)
        self.kv = KVCacheManager(NUM_BLOCKS, 4, make_policy(policy, sessions=self.sessions))
        self.kv.ranking.lazy = lazy
        self.sam = SessionAwareManager(self.kv, self.sessions, clock=lambda: self.now)
        self.held = []

    def context(self, name: str, n: int) -> list[bytes]:
        return SHARED + [b"%s%d" % (name.encode(), i) for i in range(n)]

    def apply(self, op: str, a, b) -> None:
        ref = SessionRef("t", a, PARENT[a]) if a in PARENT else None
        s = self.sessions.get("t", a) if ref is not None else None
        pool = self.kv.pool
        if op == "arrive":
            self.sam.on_arrival(ref)
        elif op == "done" and s is not None and s.num_inflight:
            self.sam.on_done(s.key, self.context(a, b))
        elif op == "place":  # the context's KV lands on the device as cached blocks
            todo = [h for h in self.context(a, b) if pool.lookup(h) is None]
            if pool.can_allocate(len(todo)):
                blocks = pool.allocate(len(todo))
                for blk, h in zip(blocks, todo):
                    pool.register(blk, h)
                pool.release(blocks)
        elif op == "alloc" and pool.can_allocate(a):  # a running request takes room, then ends
            self.held.append(pool.allocate(a))
            if len(self.held) > 2:
                pool.release(self.held.pop(0))
        elif op == "ttl" and s is not None:
            self.sessions.set_ttl(s.key, float(b), self.now)
        elif op == "edit" and s is not None:
            self.sam.apply(ref, CacheEdit(b))
        elif op == "tick":
            self.now += a
            self.sam.on_step(self.now)

    def peek(self, n: int, cls: int) -> tuple:
        """What the scheduler and a prefetch read each step: the first victims, a count below
        a class."""
        pool = self.kv.pool
        return [(b.block_id, b.hash) for b in pool.choose_victims(n)], pool.num_cached_below(cls)

    def seen(self) -> tuple:
        """Everything a reader can see (reading settles the pending moves)."""
        victims = self.kv.pool.choose_victims(self.kv.pool.num_cached_free)
        delta = self.kv.ranking.take_delta()
        self.kv.check_integrity()
        self.sessions.check_integrity()
        return ([(b.block_id, b.hash) for b in victims], self.kv.ranking.snapshot(),
                list(delta.blocks.items()), list(delta.groups.items()), self.kv.ranking.num_moves,
                self.kv.pool.num_cached_below(3))


@pytest.mark.parametrize("name", policy_names())
@settings(max_examples=120, deadline=None)
@given(ops=st.lists(_ops, max_size=60))
def test_lazy_arrivals_give_what_eager_moves_give(name, ops):
    lazy, eager = Cache(name, lazy=True), Cache(name, lazy=False)
    for i, (op, a, b) in enumerate(ops):
        lazy.apply(op, a, b)
        eager.apply(op, a, b)
        if op == "check":
            assert lazy.seen() == eager.seen(), f"op {i}: lazy and eager differ"
        elif op == "peek":  # a partial read: settles only if it reaches a pending class
            assert lazy.peek(a, b) == eager.peek(a, b), f"op {i}: a partial read differs"
    assert lazy.seen() == eager.seen()


def test_an_arrival_then_its_end_move_the_session_once():
    """A request that ends before anything reads the order: one walk, at its end."""
    c = Cache("sam", lazy=True)
    ref = SessionRef("t", "a", "a")
    c.sam.on_arrival(ref)
    c.apply("place", "a", 4)
    c.sam.on_done("t\x1fa", c.context("a", 4))
    c.kv.ranking.settle()
    moves = c.kv.ranking.num_moves
    c.now += 1
    c.sam.on_arrival(ref)
    assert c.kv.ranking._pending is not None and c.kv.ranking.num_moves == moves, \
        "an arrival moved groups before anything read them"
    c.now += 1
    c.sam.on_done("t\x1fa", c.context("a", 4))
    assert c.kv.ranking._pending is None and c.kv.ranking.num_moves > moves, \
        "the request's end left the moves pending"
    c.kv.check_integrity()
    c.sessions.check_integrity()


def test_a_class_that_comes_back_refiles_the_node_as_two_moves_do():
    """Arrive then end in the class it had: eager moved its node away and back (to the back of
    its class, behind the others there); lazy must leave it in the same place."""
    caches = [Cache("sam", lazy=True), Cache("sam", lazy=False)]
    for c in caches:
        for name in ("a", "b"):
            c.apply("arrive", name, 0)
            c.apply("place", name, 3)
            c.apply("done", name, 3)
    came_back = False
    for step in range(30):
        before = [c.kv.ranking.session_class("t\x1fa") for c in caches]
        for c in caches:
            c.now += 0.25
            c.apply("arrive", "a", 0)
            c.apply("done", "a", 3)
        after = [c.kv.ranking.session_class("t\x1fa") for c in caches]
        assert before[0] == before[1] and after[0] == after[1]
        b_class = caches[0].kv.ranking.session_class("t\x1fb")
        if after[0] == before[0] == b_class:
            came_back = True
        assert caches[0].seen() == caches[1].seen(), f"step {step}: lazy and eager differ"
    assert came_back, "the sequence never brought a's class back next to b's (test setup)"


def test_take_delta_with_no_change_is_empty_and_loses_nothing():
    """A step with no class change hands the tiers an empty delta (one shared object, not built
    per step); the next change still reaches them whole."""
    c = Cache("sam", lazy=True)
    c.sam.on_arrival(SessionRef("t", "a", "a"))
    c.sam.on_done(c.sessions.get("t", "a").key, c.context("a", 3))
    first = c.kv.ranking.take_delta()
    assert set(first.blocks) == set(c.context("a", 3))
    assert not c.kv.ranking.take_delta() and not c.kv.ranking.take_delta()
    c.sam.on_arrival(SessionRef("t", "d", "d"))
    c.sam.on_done(c.sessions.get("t", "d").key, c.context("d", 2))
    again = c.kv.ranking.take_delta()
    assert set(again.blocks) == set(c.context("d", 2))  # the shared prefix regrouped too
    assert not first.blocks.keys() - set(c.context("a", 3))  # the first delta was not reused
