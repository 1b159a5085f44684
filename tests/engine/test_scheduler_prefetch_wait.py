"""A request whose prefix a pending prefetch is bringing up takes that transfer over as its own
load (`TierLoads.adopt`): admitted as LOADING at once, its room reserved, no second copy
(scheduler + KV manager + TierConnector over the simulator's HostTier and VirtualMover, no disk,
no model).

The agent sends its prefetch hint just before its call. The call's own load of the same blocks
took a second copy's room and the mover's time again (the fifteenth session); holding the call in
the queue until the prefetch landed instead left its room to the candidates after it (the
sixteenth session's review: the whole trace set's queue grew 0.0676 -> 0.0843 s/call)."""

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


def _setup(num_blocks: int = 8):
    clock = EventClock()
    sessions = SessionRegistry()
    kv = KVCacheManager(num_blocks, BS, make_policy("sam", sessions=sessions))
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


def _kv_of(kv, blocks) -> list[torch.Tensor]:
    layout = kv.tiers.stack.layout
    got = torch.empty((len(blocks), *layout.shape), dtype=layout.dtype)
    kv.tiers.io.read([b.block_id for b in blocks], got)
    return list(got)


def _moved_up(kv) -> int:
    """Blocks the mover copied up (host -> device) so far."""
    moved = kv.tiers.stack.stats().transfers.blocks_moved
    return sum(n for d, n in moved.items() if d.endswith("device"))


def test_a_request_takes_over_the_prefetch_of_its_prefix_and_loads_no_second_copy():
    kv, clock, sessions = _setup()
    tokens = list(range(13))
    payloads = _store(kv, clock, tokens, 3)
    held = _held(sessions, tokens, 3)
    assert kv.tiers.prefetch(held) == (3, 0)  # the prefetch hint, just before the call
    fetching = kv.tiers.prefetching_blocks()
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock)
    a = seq_of("a", tokens)
    sched.add_request(a)
    out = sched.schedule()
    # admitted now, on the prefetch's own transfer: its blocks, no second copy's
    assert a.status is SeqStatus.LOADING and not out.scheduled
    assert a.block_table == fetching and not kv.tiers.prefetching_blocks()
    assert not any(kv.tiers.prefetching(h) for h in held) and kv.tiers.load_tiers("a") == ["host"] * 3
    assert kv.pool.num_free == 8 - 3
    kv.check_integrity()
    _run(clock)  # the copy lands; the next step lands it as a's load
    out = sched.schedule()
    assert a.status is SeqStatus.RUNNING
    assert a.num_computed_tokens == 12 and a.num_cached_tokens == 12
    assert [s.num_new_tokens for s in out.scheduled] == [1]
    assert [kv.pool.lookup(h) for h in held] == a.block_table[:3]
    assert all(torch.equal(g, p) for g, p in zip(_kv_of(kv, a.block_table[:3]), payloads))
    assert kv.hit_tokens_by_tier == {"device": 0, "host": 12}
    assert kv.tiers.counters.num_loaded == 3 and kv.tiers.counters.num_prefetched == 0
    assert _moved_up(kv) == 3
    kv.check_integrity()


def test_a_request_needs_room_only_for_the_blocks_past_the_prefetch():
    """6 blocks: 3 the prefetch's, 1 running o's and 1 reserved to its end; a (4 blocks to its
    end) fits in the one left (counting its in-flight blocks as room it needs, it did not)."""
    kv, clock, sessions = _setup(num_blocks=6)
    tokens = list(range(13))
    _store(kv, clock, tokens, 3)
    held = _held(sessions, tokens, 3)
    assert kv.tiers.prefetch(held) == (3, 0)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock, admission="short-first")
    other = seq_of("o", list(range(700, 704)))  # running: a is not alone
    sched.add_request(other)
    sched.schedule()
    a = seq_of("a", tokens)
    sched.add_request(a)
    sched.schedule()
    assert a.status is SeqStatus.LOADING
    _run(clock)
    sched.schedule()
    assert a.status is SeqStatus.RUNNING and a.num_cached_tokens == 12
    kv.check_integrity()


def test_the_room_of_a_request_on_a_prefetch_is_reserved_from_later_candidates():
    """short-first: a (its 3 blocks in flight, 1 more to its end) goes first; b, a cold 18-token
    prompt needing all 5 free blocks, must not take a's block meanwhile (held in the queue, a left
    it to b and then waited for b to end)."""
    kv, clock, sessions = _setup()
    tokens = list(range(13))
    _store(kv, clock, tokens, 3)
    held = _held(sessions, tokens, 3)
    assert kv.tiers.prefetch(held) == (3, 0)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock, admission="short-first")
    a, b = seq_of("a", tokens), seq_of("b", list(range(1000, 1018)))
    sched.add_request(a)
    sched.add_request(b)
    sched.schedule()
    assert a.status is SeqStatus.LOADING and b.status is SeqStatus.WAITING
    _run(clock)
    out = sched.schedule()
    assert a.status is SeqStatus.RUNNING and [s.seq for s in out.scheduled] == [a]
    assert b.status is SeqStatus.WAITING
    kv.check_integrity()


def test_a_request_takes_the_part_of_a_prefetch_it_needs_and_the_rest_lands_cached():
    """The session's 4 blocks are in flight; a fork of its first 2 blocks takes those 2 (a slice
    of the transfer), and the other 2 land as the prefetch's, cached on the device."""
    kv, clock, sessions = _setup()
    tokens = list(range(17))
    payloads = _store(kv, clock, tokens, 4)
    held = _held(sessions, tokens, 4)
    assert kv.tiers.prefetch(held) == (4, 0)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock)
    a = seq_of("a", tokens[:9])
    sched.add_request(a)
    sched.schedule()
    assert a.status is SeqStatus.LOADING and kv.tiers.load_tiers("a") == ["host"] * 2
    assert [kv.tiers.prefetching(h) for h in held] == [False, False, True, True]
    _run(clock)
    sched.schedule()
    assert a.status is SeqStatus.RUNNING and a.num_cached_tokens == 8
    rest = [kv.pool.lookup(h) for h in held[2:]]
    assert None not in rest and not any(kv.tiers.prefetching(h) for h in held)
    assert all(torch.equal(g, p) for g, p in zip(_kv_of(kv, a.block_table[:2] + rest), payloads))
    assert kv.tiers.counters.num_loaded == 2 and kv.tiers.counters.num_prefetched == 2
    assert _moved_up(kv) == 4
    kv.check_integrity()


def test_a_request_takes_over_the_prefetch_then_loads_the_rest_itself():
    """The prefetch brings up 2 of the 4 blocks the host holds: a's load is that transfer, then its
    own of the other 2 (one load of two parts, landing together)."""
    kv, clock, sessions = _setup()
    tokens = list(range(17))
    payloads = _store(kv, clock, tokens, 4)
    held = _held(sessions, tokens, 4)
    assert kv.tiers.prefetch(held[:2]) == (2, 0)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock)
    a = seq_of("a", tokens)
    sched.add_request(a)
    sched.schedule()
    assert a.status is SeqStatus.LOADING and kv.tiers.load_tiers("a") == ["host"] * 4
    assert len(kv.tiers.pending_futures()) == 2
    _run(clock)
    sched.schedule()
    assert a.status is SeqStatus.RUNNING and a.num_cached_tokens == 16
    assert all(torch.equal(g, p) for g, p in zip(_kv_of(kv, a.block_table[:4]), payloads))
    assert kv.tiers.counters.num_loaded == 4 and _moved_up(kv) == 4
    kv.check_integrity()


def test_another_sessions_prefetch_does_not_hold_a_request():
    """Only a prefetch of the request's own next block is taken over: with another prefix in
    flight it loads its own run at once, and the other prefetch lands as cached."""
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
    assert all(kv.tiers.prefetching(h) for h in held)
    _run(clock)
    sched.schedule()
    assert a.status is SeqStatus.RUNNING and a.num_computed_tokens == 12
    assert all(kv.pool.lookup(h) is not None for h in held)
    kv.check_integrity()
