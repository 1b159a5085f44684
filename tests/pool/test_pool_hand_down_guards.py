"""`tiers.hand_down`'s two guards: a get served from a leaving block's read-back always resolves,
even when the copy into the caller's tensor fails; a hand-down the mover refuses to queue is
reported at once, never left leaving.

    host (2 blocks) -> disk (2 blocks) -> pool (16 blocks, embedded)
"""

from __future__ import annotations

import torch

from hintkv.pool.backend import make_backend
from hintkv.sim.clock import EventClock
from hintkv.sim.costs import CostModel
from hintkv.sim.mover import VirtualMover
from hintkv.sim.profile import load_profile
from hintkv.tiers.disk import DiskTier
from hintkv.tiers.disk_format import HEADER_SIZE
from hintkv.tiers.host import HostTier
from hintkv.tiers.pool import PoolTier
from hintkv.tiers.stack import TierStack
from tests.pool.blocks import FRAME, LAYOUT, key, payload
from tests.pool.test_pool_hand_down import evict_block_0, fill, hold, make_stack  # noqa: F401 (fixture)


def test_a_get_whose_copy_fails_on_a_leaving_block_resolves_as_a_miss(make_stack):
    stack = make_stack()
    fill(stack)
    _, disk, pool = stack.tiers
    gate = hold(stack)
    evict_block_0(stack)
    with torch.inference_mode():  # the right shape and dtype; written outside inference mode, copy_ raises
        dst = torch.empty(LAYOUT.shape, dtype=LAYOUT.dtype)
    misses = disk.stats().num_misses
    got = disk.get(key(0), dst)
    gate.set()
    assert got.result(timeout=10) is False  # resolved: a miss, as any failed read
    stack.flush()
    assert disk.stats().num_misses == misses + 1
    assert pool.known(key(0))  # the hand-down itself went on: read back and kept below
    stack.check_integrity()


def test_a_hand_down_the_mover_cannot_queue_is_reported_at_once(tmp_path):
    """The simulator's mover raises at once for a link its profile lacks (h200 has no disk->pool)."""
    clock = EventClock()
    costs = CostModel(load_profile("h200-llama3-8b"))
    assert "disk->pool" not in costs.profile.links
    mover = VirtualMover(clock, costs, real_block_bytes=LAYOUT.nbytes)
    pool = PoolTier(LAYOUT, make_backend("embedded", FRAME), 16 * FRAME, key_prefix="g")
    host = HostTier(LAYOUT, 2 * LAYOUT.nbytes, mover=mover)
    disk = DiskTier(LAYOUT, tmp_path / "disk", 2 * (HEADER_SIZE + LAYOUT.nbytes), mover=mover)
    stack = TierStack([host, disk, pool], mover=mover)
    try:
        for i in range(5):  # 0 and 1 reach the disk, then 4's store makes the disk evict 0
            stack.store([(key(i), payload(i))])
            while clock.run_next():
                pass
        assert disk.stats().num_evicted == 1
        assert not disk.contains(key(0)) and stack.lookup([key(0)]) == [None]  # not left leaving
        assert not pool.known(key(0))  # never handed down
        assert stack.stats().num_dropped == 1  # its eviction reported once, without bytes
        while clock.run_next():
            pass
        stack.check_integrity()
    finally:
        stack.close()
        pool.close()
