"""Scheduler + KV manager + TierConnector over a real disk tier, without a model: a prefix found below
is loaded while other sequences run, lands as computed KV, and a block that fails its checksum
truncates the load there (the rest is recomputed)."""

from __future__ import annotations

import time

import torch

from hintkv.cache.hashing import hash_blocks
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.cache.tier_costs import TransferCosts
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import SeqStatus
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.disk import DiskTier
from hintkv.tiers.disk_format import HEADER_SIZE
from hintkv.tiers.stack import TierStack
from tests.engine.scheduler_helpers import BS, ROOT, seq_of, store_blocks



def _setup(tmp_path):
    sessions = SessionRegistry()
    kv = KVCacheManager(8, BS, make_policy("sam", sessions=sessions))
    io = DeviceBlockIO([torch.zeros(2, 8, BS, 1, 2) for _ in range(2)])
    disk = DiskTier(io.layout, tmp_path, 16 * (HEADER_SIZE + io.layout.nbytes))
    stack = TierStack([disk])
    kv.tiers = TierConnector(kv.pool, BS, stack, io, kv.ranking, hints=False)
    return kv, io, stack


_seq, _store = seq_of, store_blocks



def _flush_until(stack: TierStack, done) -> None:
    """Run the tiers' copies until `done()`. A flush returns once the copies' futures are set, which can be
    before the mover thread has run their done-callbacks, so this polls up to a generous bound (not a
    timing check) and then requires `done()`."""
    deadline = time.monotonic() + 60
    while not done() and time.monotonic() < deadline:
        stack.flush()
        time.sleep(0.001)
    assert done(), "the tiers' copies never settled"

def test_lower_tier_prefix_loads_while_others_run_and_lands_as_computed(tmp_path):
    kv, io, stack = _setup(tmp_path)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    a, b = _seq("a", list(range(13))), _seq("b", list(range(100, 106)))
    payloads = _store(stack, io, a.token_ids, 3)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    assert a.status is SeqStatus.LOADING and [s.seq for s in out.scheduled] == [b]
    assert len(a.block_table) == 3 and a.num_computed_tokens == 0
    kv.check_integrity()
    _flush_until(stack, lambda: kv.load_ready(a))  # the loads land on the mover's threads
    out = sched.schedule()
    assert a.status is SeqStatus.RUNNING
    assert a.num_computed_tokens == 12 and a.num_cached_tokens == 12
    assert [s.num_new_tokens for s in out.scheduled if s.seq is a] == [1]
    got = torch.empty((3, *io.layout.shape))
    io.read([blk.block_id for blk in a.block_table[:3]], got)
    assert all(torch.equal(got[i], p) for i, p in enumerate(payloads))
    assert [kv.pool.lookup(h) for h in a.block_hashes[:3]] == a.block_table[:3]
    assert kv.hit_tokens_by_tier == {"device": 0, "disk": 12}
    kv.check_integrity()
    stack.close()


def test_a_corrupt_block_truncates_the_load_there(tmp_path):
    kv, io, stack = _setup(tmp_path)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    a = _seq("a", list(range(13)))
    _store(stack, io, a.token_ids, 3)
    second = hash_blocks(ROOT, a.token_ids, BS)[1]
    path = tmp_path / f"{second.hex()}.kv"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    sched.add_request(a)
    sched.schedule()
    assert a.status is SeqStatus.LOADING
    _flush_until(stack, lambda: kv.load_ready(a))
    out = sched.schedule()
    assert a.num_cached_tokens == 4  # block 0 arrived; block 1 failed; block 2 is recomputed
    assert [s.num_new_tokens for s in out.scheduled] == [9]
    assert kv.tiers.counters.num_load_failed == 2
    assert stack.stats().tiers["disk"].num_corrupt == 1
    kv.check_integrity()
    stack.close()


def test_costs_skip_a_tier_slower_than_recomputing():
    costs = TransferCosts(block_bytes=1 << 20, block_size=16)
    assert costs.worth_loading("host") and costs.worth_loading("disk")
    for _ in range(50):  # the disk turns out to deliver 10 MB/s; prefill stays fast
        costs.observe_load("disk", 1, (1 << 20) / 10e6)
        costs.observe_prefill(1024, 1024 * 1e-5)
    assert costs.worth_loading("host") and not costs.worth_loading("disk")
    assert costs.load_timeout_s(4) >= 1.0


def test_prefetch_takes_no_block_a_running_session_holds(tmp_path):
    kv, io, stack = _setup(tmp_path)
    sessions = kv.ranking.policy.sessions
    kv.tiers.hints = True
    running = hash_blocks(ROOT, list(range(24)), BS)  # 6 blocks, cached on the device
    blocks = kv.pool.allocate(6)
    for b, h in zip(blocks, running):
        kv.pool.register(b, h)
    kv.pool.release(blocks)
    sessions.on_arrival("t", "run", "run", now=0.0)
    sessions.on_done("t\x1frun", running, now=0.0)
    sessions.on_arrival("t", "run", "run", now=1.0)  # running again: its blocks are protected
    later = list(range(500, 516))
    _store(stack, io, later, 4)
    parked = hash_blocks(ROOT, later, BS)
    sessions.on_arrival("t", "p", "p", now=0.0)
    sessions.on_done("t\x1fp", parked, now=0.0)
    scheduled, on_device = kv.tiers.prefetch(parked)
    assert (scheduled, on_device) == (2, 0)  # the two empty blocks, nothing of "run"
    assert all(kv.pool.lookup(h) is not None for h in running)
    _flush_until(stack, lambda: kv.tiers.poll() is None and kv.tiers.idle())
    assert [kv.pool.lookup(h) is not None for h in parked] == [True, True, False, False]
    assert kv.tiers.prefetch(parked[:2]) == (0, 2)  # all on the device: nothing to load
    # the whole session again: its head (class 2, waiting) is all that ranks below "run", and a
    # predicted prefetch never evicts its own head to load its tail
    assert kv.tiers.prefetch(parked) == (0, 2)
    assert [kv.pool.lookup(h) is not None for h in parked] == [True, True, False, False]
    kv.check_integrity()
    stack.close()


def test_prefetch_takes_blocks_ranked_below_its_own_head(tmp_path):
    """The room of a predicted prefetch is what ranks below the session's own head, not nothing:
    unheld cached blocks make way for its tail."""
    kv, io, stack = _setup(tmp_path)
    sessions = kv.ranking.policy.sessions
    kv.tiers.hints = True
    running = hash_blocks(ROOT, list(range(16)), BS)  # 4 blocks of a running session
    unheld = hash_blocks(ROOT, list(range(900, 908)), BS)  # 2 blocks nobody holds
    blocks = kv.pool.allocate(6)
    for b, h in zip(blocks, running + unheld):
        kv.pool.register(b, h)
    kv.pool.release(blocks)
    sessions.on_arrival("t", "run", "run", now=0.0)
    sessions.on_done("t\x1frun", running, now=0.0)
    sessions.on_arrival("t", "run", "run", now=1.0)
    later = list(range(500, 516))
    _store(stack, io, later, 4)
    parked = hash_blocks(ROOT, later, BS)
    sessions.on_arrival("t", "p", "p", now=0.0)
    sessions.on_done("t\x1fp", parked, now=0.0)
    assert kv.tiers.prefetch(parked[:2]) == (2, 0)  # into the two empty blocks
    _flush_until(stack, lambda: kv.tiers.poll() is None and kv.tiers.idle())
    assert kv.tiers.prefetch(parked) == (2, 2)  # the tail takes the unheld blocks, not the head
    _flush_until(stack, lambda: kv.tiers.poll() is None and kv.tiers.idle())
    assert all(kv.pool.lookup(h) is not None for h in parked + running)
    assert all(kv.pool.lookup(h) is None for h in unheld)
    kv.check_integrity()
    stack.close()


def test_lower_tiers_evict_in_the_session_aware_order(tmp_path):
    """A full host tier evicts the block nobody holds before an older one a session holds
    (plain LRU would take the older one)."""
    from hintkv.tiers.host import HostTier

    sessions = SessionRegistry()
    kv = KVCacheManager(8, BS, make_policy("sam", sessions=sessions))
    io = DeviceBlockIO([torch.zeros(2, 8, BS, 1, 2) for _ in range(2)])
    stack = TierStack([HostTier(io.layout, 2 * io.layout.nbytes)])
    kv.tiers = TierConnector(kv.pool, BS, stack, io, kv.ranking, hints=True)
    held, unheld, new = hash_blocks(ROOT, list(range(12)), BS)
    sessions.on_arrival("t", "a", "a", now=0.0)
    sessions.on_done("t\x1fa", [held], now=0.0)
    kv.tiers.publish()  # the engine does this once per step: the tiers see the new classes
    for h in (held, unheld, new):
        assert stack.store([(h, torch.ones(io.layout.shape))])[0].result()
    assert stack.lookup([held, unheld, new]) == ["host", None, "host"]
    stack.close()


def test_a_loadable_plan_is_the_full_plan_when_it_fits_and_empty_when_it_cannot_load(tmp_path):
    """The scheduler's plan (`match_lower(loadable=True)`) stops one block past the device's
    free room: the same run as the full plan whenever that run can load, none otherwise (the
    scheduler computes such a request instead; it no longer re-plans the whole run each step)."""
    kv, io, stack = _setup(tmp_path)
    seq = _seq("a", list(range(29)))  # 7 full blocks before the last token
    _store(stack, io, seq.token_ids, 6)
    taken: list = []
    for room in range(8, -1, -1):
        full = kv.match_prefix(seq)  # the full plan
        assert len(full.lower) == 6 and full.lower_tiers == ["disk"] * 6
        capped = kv.match_prefix(seq, lower=False)
        kv.match_lower(seq, capped, loadable=True)
        assert kv.pool.num_free == room
        if room >= 6:
            assert capped.lower == full.lower and capped.lower_tiers == full.lower_tiers
        else:
            assert capped.lower == [] and capped.lower_tiers == []
            assert not kv.can_admit(seq, full, 0)  # the full plan could not load either
        if room:
            taken += kv.pool.allocate(1)
    kv.pool.release(taken)
    kv.check_integrity()
    stack.close()
