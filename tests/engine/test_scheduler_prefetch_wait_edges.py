"""The prefetch takeover's edges (`test_scheduler_prefetch_wait`'s setup: the real scheduler, KV
manager and TierConnector over the simulator's host tier, no model): a request taking over a
prefetch keeps its resident prefix and preempts no decode, a prefetch that fails, times out,
belongs to an ended session or is evicted after landing leaves the request running within one
load timeout with the stored KV or recomputed, a failed prefetch's blocks are computed by a
request admitted after that poll too, and a request's own load never takes a block a prefetch
is bringing up."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
import torch

from hintkv.cache.hashing import hash_blocks
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sessions import SessionRegistry
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence, SeqStatus
from hintkv.engine.types import SamplingParams
from hintkv.sim.clock import EventClock
from hintkv.sim.costs import CostModel
from hintkv.sim.profile import load_profile
from hintkv.sim.tiers import sim_tiers
from tests.engine.scheduler_helpers import BS, ROOT, seq_of
from tests.engine.test_scheduler_prefetch_wait import _held, _run, _setup, _store


def _resident(kv, h) -> None:
    """`h` cached on the device (ref 0), as a finished call leaves its prefix (its payload unwritten)."""
    blk = kv.pool.allocate(1)[0]
    kv.pool.register(blk, h)
    kv.pool.release([blk])


def _step(sched, out) -> None:
    sched.update_from_output(out, ModelRunnerOutput([[7] for _ in out.scheduled]))


def _kv_of(kv, seq, n: int) -> list[torch.Tensor]:
    layout = kv.tiers.stack.layout
    got = torch.empty((n, *layout.shape), dtype=layout.dtype)
    kv.tiers.io.read([b.block_id for b in seq.block_table[:n]], got)
    return list(got)


@pytest.mark.parametrize("policy", ["fcfs", "short-first"])
def test_a_request_on_a_prefetch_keeps_its_resident_prefix(policy):
    """Block 0 resident, blocks 1-3 in flight: a is admitted at once on the prefetch's transfer
    with block 0 first in its table (a later candidate cannot take it), and matches all 4."""
    clock, sessions = EventClock(), SessionRegistry()
    kv = KVCacheManager(12, BS, make_policy("sam", sessions=sessions))
    kv.tiers = sim_tiers(kv, True, 32, clock, CostModel(load_profile("h200-llama3-8b")))
    tokens = list(range(17))
    payloads = _store(kv, clock, tokens, 4)
    held = _held(sessions, tokens, 4)
    _resident(kv, held[0])
    assert kv.tiers.prefetch(held) == (3, 1)
    resident = kv.pool.lookup(held[0])
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock, admission=policy)
    a, b = seq_of("a", tokens), seq_of("b", list(range(1000, 1033)))
    sched.add_request(a)
    sched.add_request(b)
    sched.schedule()
    assert a.status is SeqStatus.LOADING and a.block_table[0] is resident
    assert kv.tiers.load_tiers("a") == ["host"] * 3
    _run(clock)
    sched.schedule()
    assert a.status is SeqStatus.RUNNING and a.num_cached_tokens == 16
    assert kv.tiers.counters.num_loaded == 3 and kv.hit_tokens_by_tier == {"device": 4, "host": 12}
    assert all(torch.equal(g, p) for g, p in zip(_kv_of(kv, a, 4)[1:], payloads[1:]))  # the prefetched
    kv.check_integrity()


def test_a_swapping_policy_preempts_no_decode_for_a_request_on_its_prefetch():
    """9 blocks: d holds 3 and 2 more to its end, the prefetch 3: a needs only the one left past
    its in-flight blocks, so no decode is swapped out for it (counting those 3 as room it needs,
    `make_room` swapped d out)."""
    kv, clock, sessions = _setup(num_blocks=9)
    tokens = list(range(13))
    _store(kv, clock, tokens, 3)
    held = _held(sessions, tokens, 3)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock, admission="prefill-first")
    d = Sequence("d", list(range(900, 909)), 9, SamplingParams(temperature=0, max_tokens=10), ROOT)
    sched.add_request(d)
    for _ in range(2):  # d's prefill, then one decode
        _step(sched, sched.schedule())
    assert d.status is SeqStatus.RUNNING and d.first_token_time is not None
    assert kv.tiers.prefetch(held) == (3, 0)
    a = seq_of("a", tokens)
    sched.add_request(a)
    out = sched.schedule()
    assert sched.num_preemptions == 0 and not out.preempted and d.status is SeqStatus.RUNNING
    assert a.status is SeqStatus.LOADING
    _step(sched, out)
    _run(clock)
    sched.schedule()
    assert a.status is SeqStatus.RUNNING and a.num_cached_tokens == 12


def _hang(kv, clock, sessions):
    kv.tiers.stack.load_many = lambda hashes, staging: Future()  # the tier never answers


def _fail(kv, clock, sessions):
    def load_many(hashes, staging):
        f = Future()
        f.set_result([False] * len(hashes))
        return f
    kv.tiers.stack.load_many = load_many


def _session_ends(kv, clock, sessions):
    sessions.end("t\x1fa")  # in flight: its blocks are released empty


def _evicted_after_landing(kv, clock, sessions):
    _run(clock)
    kv.tiers.poll()  # lands and registers the prefetch's blocks
    taken = kv.pool.allocate(kv.pool.num_free)  # someone else's blocks evict them
    kv.flush_write_downs()
    _run(clock)
    kv.pool.release(taken)


@pytest.mark.parametrize("before, after, cached", [
    (_hang, None, 0), (_fail, None, 0), (None, _session_ends, 12), (None, _evicted_after_landing, 12)])
def test_a_prefetch_that_does_not_deliver_leaves_the_request_running_within_one_load_timeout(
        before, after, cached):
    """Stepped as an idle engine does (50 ms apart): running by one prefetch's load timeout plus
    two steps, with the stored KV (reloaded by its own load) or recomputed (a hung or failing
    tier: after the prefetch's timeout it does not wait a second one on the same tier)."""
    kv, clock, sessions = _setup()
    tokens = list(range(13))
    payloads = _store(kv, clock, tokens, 3)
    held = _held(sessions, tokens, 3)
    if before:
        before(kv, clock, sessions)
    assert kv.tiers.prefetch(held) == (3, 0)
    if after:
        after(kv, clock, sessions)
    limit = kv.tiers.costs.load_timeout_s(3) + 2 * 0.05
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock)
    a = seq_of("a", tokens)
    sched.add_request(a)
    while a.status is not SeqStatus.RUNNING and clock() <= limit:
        sched.schedule()
        clock.after(0.05, lambda: None)
        clock.run_next()
    assert a.status is SeqStatus.RUNNING and clock() <= limit
    assert a.num_cached_tokens == cached
    assert all(torch.equal(g, p) for g, p in zip(_kv_of(kv, a, cached // BS), payloads))
    kv.check_integrity()


def test_a_requests_own_load_stops_at_the_first_block_a_prefetch_is_bringing_up():
    """Its next block was evicted after the prefetch was planned (it was on the device then), the
    later ones are in flight: its own load takes block 0 only (no second copy), and it computes
    the rest once that lands (it does not wait for the prefetch a second time)."""
    kv, clock, sessions = _setup()
    tokens = list(range(13))
    payloads = _store(kv, clock, tokens, 3)
    held = _held(sessions, tokens, 3)
    _resident(kv, held[0])
    assert kv.tiers.prefetch(held) == (2, 1)
    taken = kv.pool.allocate(kv.pool.num_free)  # another sequence takes the room: block 0 evicted
    kv.flush_write_downs()
    kv.pool.release(taken)
    assert kv.pool.lookup(held[0]) is None
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock)
    a = seq_of("a", tokens)
    sched.add_request(a)
    sched.schedule()
    assert a.status is SeqStatus.LOADING and kv.tiers.load_tiers("a") == ["host"]
    assert not any(kv.tiers.prefetching(h) for h in held[:1]) and all(kv.tiers.prefetching(h) for h in held[1:])
    _run(clock)
    sched.schedule()
    assert a.status is SeqStatus.RUNNING and a.num_cached_tokens == 4
    assert kv.tiers.counters.num_loaded == 1
    assert torch.equal(_kv_of(kv, a, 1)[0], payloads[0])
    kv.check_integrity()


def test_a_failed_prefetchs_blocks_are_computed_by_a_request_admitted_after_that_poll():
    """The tier hangs: the prefetch times out in one poll, the call comes a step later. Its plan
    skips those blocks for one load timeout (computed at once), not only in the failing poll's
    step (it loaded them from the hung tier again and waited out a second timeout)."""
    kv, clock, sessions = _setup()
    tokens = list(range(13))
    _store(kv, clock, tokens, 3)
    held = _held(sessions, tokens, 3)
    _hang(kv, clock, sessions)
    assert kv.tiers.prefetch(held) == (3, 0)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, clock=clock)
    clock.after(kv.tiers.costs.load_timeout_s(3) + 0.01, lambda: None)
    clock.run_next()
    sched.schedule()  # nothing waiting: the poll finds the prefetch timed out
    assert not kv.tiers.prefetching(held[0])
    clock.after(0.05, lambda: None)
    clock.run_next()
    a = seq_of("a", tokens)
    sched.add_request(a)
    out = sched.schedule()
    assert a.status is SeqStatus.RUNNING and [s.num_new_tokens for s in out.scheduled] == [13]
    assert a.num_cached_tokens == 0
    kv.check_integrity()
