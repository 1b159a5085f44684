"""A request whose prefix a pending prefetch is bringing up waits for it instead of loading a second
copy (scheduler + KV manager + TierConnector over the simulator's HostTier and VirtualMover, no disk, no model).

The agent sends its prefetch hint just before its call; the call's own load of the same blocks took
a second copy's room (out of other requests' cached prefixes) and the mover's time again."""

from __future__ import annotations

import torch

from hintkv.cache.hashing import hash_blocks
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sessions import SessionRegistry
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import SeqStatus
from hintkv.sim.clock import EventClock
from hintkv.sim.costs import CostModel
from hintkv.sim.profile import load_profile
from hintkv.sim.tiers import sim_tiers
from tests.engine.scheduler_helpers import BS, ROOT, seq_of

# the simulator's tiers: the real HostTier, TierStack and TierConnector, with copies that land
# only when the event clock runs them (so a prefetch is still in flight when the call comes)


def _setup():
    clock = EventClock()
    sessions = SessionRegistry()
    kv = KVCacheManager(8, BS, make_policy("sam", sessions=sessions))
    kv.tiers = sim_tiers(kv, True, 16, clock, CostModel(load_profile("h200-llama3-8b")))
    return kv, clock, sessions


def _run(clock: EventClock) -> None:
    while clock.run_next():
        pass


def _store(kv, clock, tokens: list[int], num_blocks: int) -> list[torch.Tensor]:
    """`num_blocks` of `tokens` stored on the host tier (the device never held them)."""
    layout = kv.tiers.stack.layout
    hashes = hash_blocks(ROOT, tokens, BS)[:num_blocks]
    payloads = [torch.full(layout.shape, i + 1, dtype=layout.dtype) for i in range(num_blocks)]
    futures = kv.tiers.stack.store(list(zip(hashes, payloads)))
    _run(clock)
    assert all(f.result() for f in futures)
    return payloads


def _held(sessions, tokens: list[int], num_blocks: int):
    held = hash_blocks(ROOT, tokens, BS)[:num_blocks]
    sessions.on_arrival("t", "a", "a", now=0.0)
    sessions.on_done("t\x1fa", held, now=0.0)  # the session holds them: a prefetch keeps them
    return held


def test_a_request_waits_for_the_prefetch_of_its_prefix_and_loads_no_second_copy():
    kv, clock, sessions = _setup()
    tokens = list(range(13))
    payloads = _store(kv, clock, tokens, 3)
    held = _held(sessions, tokens, 3)
    assert kv.tiers.prefetch(held) == (3, 0)  # the prefetch hint, just before the call
    assert all(kv.tiers.prefetching(h) for h in held)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock)
    a = seq_of("a", tokens)
    sched.add_request(a)
    out = sched.schedule()
    # not LOADING: no load of its own, no second copy's blocks taken
    assert a.status is SeqStatus.WAITING and not out.scheduled and not a.block_table
    assert kv.pool.num_free == 8 - 3
    _run(clock)  # the prefetch's copy lands; the next step's poll registers its blocks
    out = sched.schedule()
    assert not any(kv.tiers.prefetching(h) for h in held)
    assert a.status is SeqStatus.RUNNING
    assert a.num_computed_tokens == 12 and a.num_cached_tokens == 12
    assert [s.num_new_tokens for s in out.scheduled] == [1]
    assert [kv.pool.lookup(h) for h in held] == a.block_table[:3]
    got = torch.empty((3, *kv.tiers.stack.layout.shape), dtype=kv.tiers.stack.layout.dtype)
    kv.tiers.io.read([blk.block_id for blk in a.block_table[:3]], got)
    assert all(torch.equal(got[i], p) for i, p in enumerate(payloads))
    assert kv.hit_tokens_by_tier["device"] == 12 and kv.tiers.counters.num_loaded == 0
    kv.check_integrity()


def test_another_sessions_prefetch_does_not_hold_a_request():
    """Only a prefetch of the request's own next block holds it: with another prefix in flight
    it loads its own run at once."""
    kv, clock, sessions = _setup()
    mine, other = list(range(13)), list(range(500, 513))
    _store(kv, clock, mine, 3)
    _store(kv, clock, other, 3)
    held = _held(sessions, other, 3)
    assert kv.tiers.prefetch(held) == (3, 0)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock)
    a = seq_of("a", mine)
    sched.add_request(a)
    sched.schedule()
    assert a.status is SeqStatus.LOADING and kv.tiers.load_tiers("a") == ["host"] * 3
    _run(clock)
    sched.schedule()
    assert a.status is SeqStatus.RUNNING and a.num_computed_tokens == 12
    assert all(kv.pool.lookup(h) is not None for h in held)
    kv.check_integrity()
