"""The contract every eviction policy passes (parametrized over the registry).

Random cycles of allocate / register / release / session events / clock ticks on a real block
pool + session registry + class ranking, checking after every step:
  - choosing victims changes nothing (same answer twice, same counts, same index);
  - victims come lowest class first, and every cached block sits in its current class;
  - free + cached + in use == total, and the ranking's counts match the sessions' held lists.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy, policy_names
from hintkv.cache.sessions import SessionRegistry

NUM_BLOCKS = 12
SESSIONS = ["a", "b", "c", "d"]

_ops = st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 4), st.integers(0, 40)),
    st.tuples(st.just("release"), st.integers(0, 7), st.integers(0, 0)),
    st.tuples(st.just("arrive"), st.sampled_from(SESSIONS), st.integers(0, 0)),
    st.tuples(st.just("done"), st.sampled_from(SESSIONS), st.integers(0, 40)),
    st.tuples(st.just("suspend"), st.sampled_from(SESSIONS), st.integers(0, 0)),
    st.tuples(st.just("prefetch"), st.sampled_from(SESSIONS), st.integers(0, 0)),
    st.tuples(st.just("end"), st.sampled_from(SESSIONS), st.integers(0, 0)),
    st.tuples(st.just("ttl"), st.sampled_from(SESSIONS), st.integers(1, 30)),
    st.tuples(st.just("tick"), st.integers(1, 120), st.integers(0, 0)),
)


def _state(pool) -> tuple:
    return (pool.num_free, pool.num_cached_free, pool.num_in_use,
            sorted((h, b.block_id) for h, b in pool._index.items()),
            [(b.ref_cnt, b.hash) for b in pool.blocks], list(pool._cached.items()))


def _check_victims(kv) -> None:
    pool = kv.pool
    before = _state(pool)
    for n in {1, pool.num_cached_free // 2, pool.num_cached_free}:
        first = pool.choose_victims(n)
        assert pool.choose_victims(n) == first, "choosing victims twice gave two answers"
        assert len(first) == min(n, pool.num_cached_free)
        assert all(b.ref_cnt == 0 and b.hash is not None for b in first)
        classes = [kv.ranking.block_class(b.hash) for b in first]
        assert classes == sorted(classes), f"victims not lowest class first: {classes}"
    assert _state(pool) == before, "choosing victims changed the pool"


@pytest.mark.parametrize("name", policy_names())
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(_ops, max_size=40))
def test_policy_contract(name, ops):
    sessions = SessionRegistry(protect_budget_blocks=NUM_BLOCKS)
    kv = KVCacheManager(NUM_BLOCKS, 4, make_policy(name, sessions=sessions))
    pool = kv.pool
    held: list[list] = []  # block lists held by "running sequences"
    now = 1000.0
    kv.ranking.clock = lambda: now
    for op, a, b in ops:
        if op == "alloc" and pool.can_allocate(a):
            blocks = pool.allocate(a)
            for i, blk in enumerate(blocks):
                pool.register(blk, b"h%d" % (b + i))  # a duplicate hash stays private
            held.append(blocks)
        elif op == "release" and held:
            pool.release(held.pop(a % len(held)))
        elif op == "arrive":
            sessions.on_arrival("t", a, a, now)
        elif op == "done" and sessions.get("t", a) is not None:
            s = sessions.get("t", a)
            sessions.on_done(s.key, [b"h%d" % i for i in range(b, b + 3)], now)
        elif op == "suspend" and sessions.get("t", a) is not None:
            sessions.suspend(sessions.get("t", a).key)
        elif op == "prefetch" and sessions.get("t", a) is not None:
            sessions.prefetch(sessions.get("t", a).key, now)
        elif op == "end" and sessions.get("t", a) is not None:
            for h in sessions.end(sessions.get("t", a).key):
                blk = pool.lookup(h)
                if blk is not None:
                    pool.drop(blk)
        elif op == "ttl" and sessions.get("t", a) is not None:
            sessions.set_ttl(sessions.get("t", a).key, float(b), now)
        elif op == "tick":
            now += a
            kv.ranking.tick(now, sessions.sessions)
            for s in sessions.live():  # recheck_after never lets a class go stale
                got = kv.ranking.session_class(s.key)
                # (a session predicted from the shared estimate drifts as others arrive: it is
                # rechecked at least every MAX_RECHECK_S instead)
                if got is not None and s.gaps.known:
                    assert got in {kv.ranking.policy.session_class(s, now),
                                   kv.ranking.policy.session_class(s, now - 0.002)}
        kv.check_integrity()
        sessions.check_integrity()
        _check_victims(kv)
    for blocks in held:
        pool.release(blocks)
    kv.check_integrity()
    assert pool.num_free == NUM_BLOCKS


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_declares_its_classes(name):
    p = make_policy(name, sessions=SessionRegistry())
    assert p.num_classes >= 1 and 1 <= p.protected_class <= p.num_classes
