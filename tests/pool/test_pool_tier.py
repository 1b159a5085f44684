"""PoolTier: the Tier contract over each backend (byte-exact round trips of real KV block
payloads, eviction, integrity), plus what the pool adds: frames checked on every read, content
keys stored once across instances, plain-LRU mode, keep-alive batching."""

from __future__ import annotations

import pytest
import torch

from hintkv.tiers.pool import PoolTier
from hintkv.tiers.ranks import RankBoard
from tests.pool.blocks import FRAME, LAYOUT, key, payload, same


@pytest.fixture
def make_tier(make_pool_backend, prefix):
    made = []

    def make(blocks: int, **kw) -> PoolTier:
        t = PoolTier(LAYOUT, make_pool_backend(FRAME), blocks * FRAME, key_prefix=prefix, **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def get(tier: PoolTier, k: bytes) -> torch.Tensor | None:
    dst = torch.empty(LAYOUT.shape, dtype=LAYOUT.dtype)
    return dst if tier.get(k, dst).result(timeout=10) else None


def test_round_trip_eviction_and_removal(make_tier, backend_name):
    t = make_tier(3)
    evicted = []
    t.set_on_evict(lambda k, p: evicted.append(k))
    assert all(f.result(timeout=10) for f in t.put([(key(i), payload(i)) for i in range(3)]))
    assert t.contains_many([key(0), key(1), key(9)]) == [True, True, False]
    assert same(get(t, key(0)), payload(0))  # key 0 is now the most recent
    assert t.put([(key(3), payload(3))])[0].result(timeout=10)
    assert evicted == [key(1)]
    t.flush()
    assert not t.known(key(1))
    if backend_name != "embedded-dir":  # a victim is released: a shared directory's fresh file is leased a while
        assert not t.contains(key(1)) and get(t, key(1)) is None  # gone from the pool, too
    assert t.remove(key(2)) and not t.remove(key(2))
    t.flush()
    assert not t.known(key(2))
    if backend_name != "embedded-dir":  # a shared directory's fresh file is leased a while
        assert get(t, key(2)) is None
    assert t.usage().num_blocks == 2 and t.usage().bytes_used == 2 * FRAME
    s = t.stats()
    assert (s.num_puts, s.num_evicted, s.num_removed) == (4, 1, 1)
    assert t.pool_stats()["bytes_peak"] == 3 * FRAME
    t.check_integrity()


def test_victims_follow_the_published_classes(make_tier):
    t = make_tier(3)
    t.set_ranks(RankBoard({key(0): 3, key(1): 3}))  # e.g. SAM: block 2 is nobody's
    for i in range(3):
        t.put([(key(i), payload(i))])[0].result(timeout=10)
    t.put([(key(3), payload(3))])[0].result(timeout=10)
    assert [t.known(key(i)) for i in range(4)] == [True, True, False, True]


def test_plain_lru_mode_ignores_sessions(make_tier):
    t = make_tier(3, session_aware=False)
    t.set_ranks(RankBoard({key(0): 3, key(1): 3}))  # ignored: plain LRU
    for i in range(3):
        t.put([(key(i), payload(i))])[0].result(timeout=10)
    assert not t.remove(key(1))  # a plain store never hears of sessions
    t.keep_alive([key(0)])
    t.put([(key(3), payload(3))])[0].result(timeout=10)
    assert t.contains_many([key(i) for i in range(4)]) == [False, True, True, True]
    assert t.pool_stats()["keepalive_calls"] == 0


def test_keep_alive_is_one_batched_call(make_tier):
    t = make_tier(8)
    t.put([(key(i), payload(i)) for i in range(5)])
    t.keep_alive([key(i) for i in range(5)])
    t.flush()
    s = t.pool_stats()
    assert s["keepalive_calls"] == 1 and s["keepalive_keys"] == 5
    assert s["put_calls"] == 1  # five puts queued together: one batched call


def test_identical_blocks_from_two_instances_are_stored_once(make_tier, backend_name):
    if backend_name == "embedded":
        pytest.skip("the in-process pool is one instance's own")
    a, b = make_tier(4), make_tier(4)
    assert a.put([(key(1), payload(1))])[0].result(timeout=10)
    assert b.contains(key(1))  # b never stored it: found in the pool
    assert b.put([(key(1), payload(1))])[0].result(timeout=10)
    assert b.pool_stats()["dedup"] == 1 and b.usage().bytes_used == 0
    assert same(get(b, key(1)), payload(1))
    assert a.usage().bytes_used == FRAME and b.pool_stats()["remote_hits"] == 1
    assert b.remove(key(1))  # b stored nothing: the block stays for a
    b.flush()
    assert same(get(a, key(1)), payload(1))


def test_a_wrong_or_torn_blob_is_a_miss_never_wrong_kv(make_tier, backend_name):
    t = make_tier(4)
    t.put([(key(1), payload(1)), (key(2), payload(2))])
    t.flush()
    blob = torch.zeros(FRAME, dtype=torch.uint8)
    assert t.backend.get([t.pool_key(key(1))], [blob]) == [True]
    blob[-1] ^= 1  # one bit of the payload
    t.backend.put([t.pool_key(key(1))], [blob])
    other = blob.clone()
    assert t.backend.get([t.pool_key(key(2))], [other]) == [True]
    t.backend.put([t.pool_key(key(3))], [other])  # key 2's frame under key 3's name
    assert get(t, key(1)) is None
    assert get(t, key(3)) is None
    assert same(get(t, key(2)), payload(2))
    assert t.stats().num_corrupt == 2


def test_an_ended_session_block_stays_while_another_instance_keeps_it_alive(make_tier,
                                                                            backend_name):
    if backend_name == "embedded":
        pytest.skip("the in-process pool is one instance's own")
    a, b = make_tier(4), make_tier(4)
    assert a.put([(key(1), payload(1))])[0].result(timeout=10)
    assert same(get(b, key(1)), payload(1))  # b's live session uses it: known there now
    b.keep_alive([key(1)])
    b.flush()
    assert a.remove(key(1))  # a's session ended: a hands the block back...
    a.flush()
    assert same(get(b, key(1)), payload(1))  # ...but b's lease keeps it in the pool
    assert a.pool_stats()["release_leased"] >= 1 and a.pool_stats()["released"] == 0


def test_a_capacity_victim_another_instance_keeps_alive_stays_in_the_pool(make_tier, backend_name):
    """Review rev26 A12: instance a, full, took as its victim a block that b's live session found and keeps alive,
    and removed it outright; b's next load missed and recomputed (after a failover: the moved session's pooled
    prefix, stored by its old home). A victim is released as an ended session's block is: b's lease keeps it."""
    if backend_name == "embedded":
        pytest.skip("the in-process pool is one instance's own")
    a, b = make_tier(1), make_tier(4)  # a holds one block
    assert a.put([(key(1), payload(1))])[0].result(timeout=10)
    assert same(get(b, key(1)), payload(1))  # b's live session uses it
    b.keep_alive([key(1)])
    b.flush()
    assert a.put([(key(2), payload(2))])[0].result(timeout=10)  # a needs room: key 1 is its victim
    a.flush()
    assert not a.known(key(1)) and a.usage().num_blocks == 1  # a's share is free for key 2 all the same
    assert same(get(b, key(1)), payload(1)), "a removed a block b keeps alive"
    assert a.pool_stats()["release_leased"] >= 1


def test_a_victim_stored_again_before_its_release_ran_stays_ours(make_tier):
    """A put that evicts a block and stores it again in one call (capacity 2: key 0 is the victim of [0, 1, 2]):
    the release queued for it finds it known again, so the pool's copy stays, owned here, and is not sent again."""
    t = make_tier(2)
    assert t.put([(key(0), payload(0))])[0].result(timeout=10)
    t.put([(key(i), payload(i)) for i in range(3)])[0].result(timeout=10)
    t.flush()
    assert [t.known(key(i)) for i in range(3)] == [True, True, False]
    assert t.usage().bytes_used == 2 * FRAME  # both owned: this instance hands them back when they go
    s = t.pool_stats()
    assert (s["dedup"], s["bytes_put"]) == (1, 2 * FRAME)
    assert same(get(t, key(0)), payload(0))
    t.check_integrity()


def test_the_pool_tiers_threads_run_without_openmp(make_tier):
    """Its worker frames blocks (stack and copies above ATen's grain) and its call threads hand them to the backend:
    neither runs an OpenMP region, whose pool would stay beside the engine thread's (libgomp then throttles every
    spin): both see an OpenMP count of 1."""
    if torch.get_num_threads() < 2:
        pytest.skip("one OpenMP thread: nothing to tell apart")
    t = make_tier(4)
    seen: dict[str, int] = {}
    framing, putting = t._frames, t.backend.put
    t._frames = lambda items: (seen.setdefault("worker", torch.get_num_threads()), framing(items))[1]
    t.backend.put = lambda *a, **kw: (seen.setdefault("call", torch.get_num_threads()), putting(*a, **kw))[1]
    assert t.put([(key(0), payload(0))])[0].result(timeout=10)
    assert seen == {"worker": 1, "call": 1} and torch.get_num_threads() > 1
