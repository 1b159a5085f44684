"""SAM's resume-prefetch policies (`cache.resume_prefetch`): what follows a predicted prefetch.

A real pool, registry, SAM and tier connector over a real host tier. A session with a learned
gap waits with its blocks written down to host (lazy: its device copies stay). Its predicted
resume comes due while all of it is still on the device, so the first look loads nothing. Then
other work evicts its blocks and finishes (the room comes free again) before its call arrives:
`watch` looks again and brings them back ahead of the call, `once` leaves them below.
"""

from __future__ import annotations

import pytest
import torch

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.resume_prefetch import make_resume_prefetch, resume_prefetch_names
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.cache.types import SessionRef
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack

BS, NUM_BLOCKS, PER = 4, 16, 6
ROOT = namespace_root("test", "float32", BS, None)
REF = SessionRef("t", "s0", "s0")


class World:
    def __init__(self, resume: str) -> None:
        self.now = 100.0
        self.sessions = SessionRegistry()
        self.kv = kv = KVCacheManager(NUM_BLOCKS, BS, make_policy("sam", sessions=self.sessions))
        self.io = DeviceBlockIO([torch.randn(2, NUM_BLOCKS, BS, 1, 2) for _ in range(2)])
        self.stack = TierStack([HostTier(self.io.layout, 64 * self.io.layout.nbytes)])
        kv.tiers = TierConnector(kv.pool, BS, self.stack, self.io, kv.ranking, hints=True, offload_mode="lazy")
        self.sam = SessionAwareManager(kv, self.sessions, clock=lambda: self.now)
        self.sam.resume = make_resume_prefetch(resume)
        self.hashes = hash_blocks(ROOT, list(range(PER * BS)), BS)
        self.expect: dict[bytes, torch.Tensor] = {}

    def call(self, first: bool = False) -> None:
        """One call of the session, 0.1 s long, that holds `hashes` when it ends."""
        key = self.sam.on_arrival(REF)
        if first:
            blocks = self.kv.pool.allocate(PER)
            for b, h in zip(blocks, self.hashes):
                self.kv.pool.register(b, h)
                out = torch.empty((1, *self.io.layout.shape))
                self.io.read([b.block_id], out)
                self.expect[h] = out[0].clone()
        self.now += 0.1
        self.sam.on_done(key, self.hashes)
        if first:
            self.kv.pool.release(blocks)
        self.now -= 0.1

    def step(self) -> None:
        self.sam.on_step(self.now)
        self.stack.flush()
        self.kv.tiers.poll()
        self.kv.check_integrity()
        self.sessions.check_integrity()

    def on_device(self) -> int:
        return sum(b is not None for b in self.kv.pool.lookup_many(self.hashes))


def _lost_then_room(resume: str) -> World:
    w = World(resume)
    w.call(first=True)
    for _ in range(2):  # a learned gap: back 2 s after each call ended
        w.now += 2.0
        w.call()
    w.kv.tiers.offload(w.hashes)  # lazy: written down, the device copies stay
    w.stack.flush()
    w.step()
    assert w.on_device() == PER
    w.now += 1.5  # the predicted resume is within its lead time: the first look finds it all on device
    before = w.sam.num_predicted_prefetches
    w.step()
    assert w.sam.num_predicted_prefetches == before, "nothing was below: nothing to prefetch"
    # other work takes every device block (the waiting session's are evicted), then finishes
    taken = w.kv.pool.allocate(NUM_BLOCKS)
    assert w.on_device() == 0
    w.kv.tiers.flush_write_downs()
    w.kv.pool.release(taken)
    w.now += 0.05  # its call has not arrived yet
    w.step()
    w.step()
    return w


def test_watch_brings_back_what_was_evicted_after_the_first_look():
    w = _lost_then_room("watch")
    assert w.on_device() == PER, "the watch did not bring the evicted blocks back before the call"
    assert w.sam.num_predicted_prefetches == 1
    for h, want in w.expect.items():
        got = torch.empty((1, *w.io.layout.shape))
        w.io.read([w.kv.pool.lookup(h).block_id], got)
        assert torch.equal(got[0], want), "a prefetched block came back with other bytes"
    # the call arrives: the session leaves the watch
    w.sam.on_arrival(REF)
    w.step()
    assert len(w.sam.resume) == 0
    w.stack.close()


def test_once_leaves_them_below():
    w = _lost_then_room("once")
    assert w.on_device() == 0 and w.sam.num_predicted_prefetches == 0
    w.stack.close()


def test_the_watch_never_takes_a_higher_ranked_block():
    """Room for the lost blocks only comes from KV ranked below the session's: with every device
    block held by an active session (ranked above a waiting one), nothing is loaded."""
    w = World("watch")
    w.call(first=True)
    for _ in range(2):
        w.now += 2.0
        w.call()
    w.kv.tiers.offload(w.hashes)
    w.stack.flush()
    w.now += 1.5
    w.step()
    other = SessionRef("t", "busy", "busy")
    key = w.sam.on_arrival(other)  # active now: ranked above the waiting session
    busy = hash_blocks(ROOT, list(range(10_000, 10_000 + NUM_BLOCKS * BS)), BS)
    blocks = w.kv.pool.allocate(NUM_BLOCKS)
    for b, h in zip(blocks, busy):
        w.kv.pool.register(b, h)
    w.sessions.hold(key, busy)
    w.kv.tiers.flush_write_downs()
    w.kv.pool.release(blocks)  # cached, held by the active session
    w.now += 0.05
    w.step()
    assert w.on_device() == 0, "the watch evicted an active session's blocks"
    assert all(w.kv.pool.lookup(h) is not None for h in busy)
    w.stack.close()


def test_unknown_name_is_a_clear_error():
    assert {"once", "watch"} <= set(resume_prefetch_names())
    with pytest.raises(ValueError, match="unknown resume prefetch"):
        make_resume_prefetch("sometimes")
