"""An eager offload never splits a chain: device copies go from the session's tail while each is
stored below, held by no other session and not in use; the first block that must stay ends it.

Sessions a and b share a 2-block system prompt and each has 2 blocks of its own. Offloading a
must drop a's own blocks and keep the shared head on the device, where b's resume matches it
(dropping it by class alone left b's device tail behind a missing head).
"""

from __future__ import annotations

import threading

import torch

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.cache.types import SessionRef
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack

BS, NUM_BLOCKS = 4, 16
ROOT = namespace_root("test", "float32", BS, None)
SYSTEM = list(range(1, 2 * BS + 1))


class World:
    def __init__(self) -> None:
        self.now = 100.0
        self.sessions = SessionRegistry()
        self.kv = KVCacheManager(NUM_BLOCKS, BS, make_policy("sam", sessions=self.sessions))
        self.io = DeviceBlockIO([torch.randn(2, NUM_BLOCKS, BS, 1, 2) for _ in range(2)])
        self.stack = TierStack([HostTier(self.io.layout, 64 * self.io.layout.nbytes)])
        self.kv.tiers = TierConnector(self.kv.pool, BS, self.stack, self.io, self.kv.ranking,
                                      hints=True, offload_mode="eager")
        self.sam = SessionAwareManager(self.kv, self.sessions, clock=lambda: self.now)
        self.held: dict[str, list[bytes]] = {}
        for name, start in (("a", 1000), ("b", 2000)):
            hashes = hash_blocks(ROOT, SYSTEM + list(range(start, start + 2 * BS)), BS)
            self.held[name] = hashes
            blocks = []
            for h in hashes:
                b = self.kv.pool.lookup(h)
                if b is None:
                    b = self.kv.pool.allocate(1)[0]
                    self.kv.pool.register(b, h)
                else:
                    self.kv.pool.touch([b])
                blocks.append(b)
            for _ in range(2):  # two calls: a learned gap, then it waits holding its context
                key = self.sam.on_arrival(SessionRef("t", name, name))
                self.now += 0.1
                self.sam.on_done(key, hashes)
            self.kv.pool.release(blocks)
        self.now += 2.0
        self.sam.on_step(self.now)  # the engine's step: both re-ranked as waiting (unprotected)
        assert all(self.kv.ranking.block_class(h) < self.kv.tiers.protected_class
                   for hs in self.held.values() for h in hs)

    def on_device(self, name: str) -> list[bool]:
        return [self.kv.pool.lookup(h) is not None for h in self.held[name]]


def test_an_eager_offload_keeps_the_shared_head_for_the_other_holder():
    w = World()
    assert w.on_device("a") == [True] * 4 and w.on_device("b") == [True] * 4
    w.kv.tiers.offload(w.held["a"])
    w.stack.flush()
    w.kv.tiers.poll()
    assert w.on_device("a") == [True, True, False, False]  # own tail dropped, shared head kept
    assert w.on_device("b") == [True] * 4  # b's chain is whole on the device
    assert w.stack.lookup(w.held["a"][2:]) == ["host", "host"]
    assert w.kv.tiers.counters.num_offload_dropped == 2
    w.kv.check_integrity()
    w.sessions.check_integrity()
    w.stack.close()


def test_an_eager_offload_stops_at_a_tail_in_use():
    w = World()
    tail = w.kv.pool.lookup(w.held["a"][-1])
    w.kv.pool.touch([tail])  # a running request reads a's last block
    w.kv.tiers.offload(w.held["a"])
    w.stack.flush()
    w.kv.tiers.poll()
    assert w.on_device("a") == [True] * 4  # nothing dropped before the tail that must stay
    assert w.kv.tiers.counters.num_offload_dropped == 0
    w.kv.pool.release([tail])
    w.kv.check_integrity()
    w.stack.close()


def test_an_offload_is_handled_once_when_its_writes_land_not_before():
    """The completion queue: `poll` drops an offload's device copies only once every write of it
    landed (done-callbacks queue it; nothing walks the futures), exactly once, and the
    connector is idle only after that `poll`."""
    w = World()
    mover = w.stack.tiers[0].mover
    gate = threading.Event()
    busy = [mover.run(None, lambda: gate.wait(30) or True, 0, 0)
            for _ in range(mover._pool._max_workers)]  # every mover worker busy: writes queue
    written, below = w.kv.tiers.offload(w.held["a"])
    assert (written, below) == (4, 0)
    w.kv.tiers.poll()
    assert w.on_device("a") == [True] * 4  # nothing landed: nothing dropped
    assert not w.kv.tiers.idle()
    gate.set()
    assert all(f.result(30) for f in busy)
    w.stack.flush()
    assert not w.kv.tiers.idle()  # landed, not yet handled by a poll
    w.kv.tiers.poll()
    assert w.on_device("a") == [True, True, False, False]
    assert w.kv.tiers.idle()
    w.kv.tiers.poll()  # handled once
    assert w.kv.tiers.counters.num_offload_dropped == 2
    w.kv.check_integrity()
    w.stack.close()
