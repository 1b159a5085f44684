"""A block the device evicts is in the top tier for every look below that follows, in the same
`schedule()` pass too: the write-down the pool's hook queued is flushed before `plan` or a
prefetch looks (`TierLoads._see_evicted`).

The engine flushes the queue after `schedule()`; a plan inside that pass (a waiting call's SRPT
key, its admission's lower run) used to find no tier for the blocks the pass had just evicted,
and so no run behind them. Under deferred offload every offloaded block goes down that way: a
236K-token call's whole host run read as none in the 100-user simulation
(docs/benchmarks/history/sim.md, twenty-first session, scale6).

Session a (4 blocks) waits holding its context, offloaded under `deferred` (nothing written) or
not offloaded at all under `lazy`; the device then hands out every block, so a's tail is evicted
and queued for its write-down, not flushed.
"""

from __future__ import annotations

import pytest
import torch

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.cache.types import CacheEdit, SessionRef
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack

BS, NUM_BLOCKS = 4, 8


class World:
    def __init__(self, mode: str, offload: bool) -> None:
        self.now = 100.0
        self.sessions = SessionRegistry()
        self.kv = KVCacheManager(NUM_BLOCKS, BS, make_policy("sam", sessions=self.sessions))
        self.io = DeviceBlockIO([torch.randn(2, NUM_BLOCKS, BS, 1, 2) for _ in range(2)])
        self.stack = TierStack([HostTier(self.io.layout, 64 * self.io.layout.nbytes)])
        self.tiers = TierConnector(self.kv.pool, BS, self.stack, self.io, self.kv.ranking,
                                   hints=True, offload_mode=mode)
        self.kv.tiers = self.tiers
        self.sam = SessionAwareManager(self.kv, self.sessions, clock=lambda: self.now)
        root = namespace_root("test", "float32", BS, None)
        self.held = hash_blocks(root, list(range(1, 4 * BS + 1)), BS)
        blocks = self.kv.pool.allocate(len(self.held))
        for b, h in zip(blocks, self.held):
            self.kv.pool.register(b, h)
        ref = SessionRef("t", "a", "a")
        for _ in range(2):  # two calls: a learned gap, then it waits holding its context
            key = self.sam.on_arrival(ref)
            self.now += 0.1
            self.sam.on_done(key, self.held)
        self.kv.pool.release(blocks)
        if offload:
            self.sam.apply(ref, CacheEdit("offload"))
        self.now += 2.0
        self.sam.on_step(self.now)
        self.stack.flush()
        self.written_at_hint = self.stack.lookup(self.held).count("host")
        # the pass's allocation: every empty block, then two victims, a's tail
        self.taken = self.kv.pool.allocate(NUM_BLOCKS - len(self.held) + 2)

    def on_device(self) -> list[bool]:
        return [self.kv.pool.lookup(h) is not None for h in self.held]


@pytest.mark.parametrize("mode, offload", [("deferred", True), ("lazy", False)])
def test_a_plan_in_the_same_pass_finds_what_the_pass_evicted(mode, offload):
    w = World(mode, offload)
    assert w.written_at_hint == 0  # nothing went down before the eviction
    assert w.on_device() == [True, True, False, False]  # the tail went first
    assert w.tiers.num_write_downs_queued == 2  # queued by the pool's hook, not gathered yet
    assert w.tiers.plan(w.held[2:]) == ["host", "host"]  # (was []: no tier held them yet)
    assert w.tiers.num_write_downs_queued == 0
    assert w.stack.lookup(w.held) == [None, None, "host", "host"]
    w.tiers.write_downs.check_flushed(w.tiers.write_downs.mark())  # the engine's check holds
    w.stack.flush()
    w.stack.close()


def test_a_prefetch_in_the_same_pass_counts_what_the_pass_evicted():
    w = World("deferred", offload=True)
    w.kv.pool.release(w.taken[-2:])  # two blocks free again, cached-unreferenced (no hash)
    scheduled, on_device, below = w.tiers.prefetch_counted(w.held)
    assert (on_device, below) == (2, 2)  # (was below 0: the evicted tail was in no tier yet)
    assert w.tiers.num_write_downs_queued == 0
    w.stack.flush()
    w.stack.close()
