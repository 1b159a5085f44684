"""The window between a disk eviction and its hand-down to the pool (`tiers.hand_down`): the
mover is held by one blocking job, as a slow disk or a burst of evictions holds it, so the
evicted block's read-back is queued while the test looks up, loads, removes or re-puts it.
Also what the hand-down reads and counts: nothing for a block the pool already has, each
read-back as a disk->pool transfer, and the keep decision made once, at eviction.

    host (2 blocks) -> disk (2 blocks) -> pool (16 blocks, embedded), one mover worker
"""

from __future__ import annotations

import threading

import pytest
import torch

from hintkv.pool.backend import make_backend
from hintkv.tiers.disk import DiskTier
from hintkv.tiers.disk_format import HEADER_SIZE
from hintkv.tiers.host import HostTier
from hintkv.tiers.mover import Mover
from hintkv.tiers.pool import PoolTier
from hintkv.tiers.stack import TierStack
from tests.pool.blocks import FRAME, LAYOUT, key, payload, same


@pytest.fixture
def make_stack(tmp_path):
    made = []

    def make(**kw) -> TierStack:
        mover = Mover(num_workers=1)
        pool = PoolTier(LAYOUT, make_backend("embedded", FRAME), 16 * FRAME, key_prefix="w")
        stack = TierStack([HostTier(LAYOUT, 2 * LAYOUT.nbytes, mover=mover),
                           DiskTier(LAYOUT, tmp_path / f"disk{len(made)}",
                                    2 * (HEADER_SIZE + LAYOUT.nbytes), mover=mover),
                           pool], mover=mover, owns_mover=True, **kw)
        made.append(stack)
        return stack

    yield make
    for s in made:
        s.close()


def fill(stack: TierStack, n: int = 4) -> None:
    """Blocks 0..n-1 one by one, each landed: with n=4, 0 and 1 on disk, 2 and 3 in host."""
    for i in range(n):
        assert stack.store([(key(i), payload(i))])[0].result(timeout=10)
        stack.flush()


def hold(stack: TierStack) -> threading.Event:
    """Occupy the stack's only mover worker until the returned event is set."""
    gate = threading.Event()
    stack.mover.run(None, lambda: gate.wait(30) or True, 0, 0)
    return gate


def evict_block_0(stack: TierStack) -> None:
    """Store block 4: the host evicts 2 into the disk, which evicts 0 (hand-down queued)."""
    evicted = stack.tiers[1].stats().num_evicted
    stack.store([(key(4), payload(4))])
    assert stack.tiers[1].stats().num_evicted == evicted + 1


def empty() -> torch.Tensor:
    return torch.empty(LAYOUT.shape, dtype=LAYOUT.dtype)


def remove(t, k: bytes, how: str) -> int:
    return int(t.remove(k)) if how == "remove" else t.remove_many([k])


@pytest.mark.parametrize("how", ["remove", "remove_many"])
def test_a_block_removed_while_its_hand_down_is_queued_never_reaches_the_pool(make_stack, how):
    stack = make_stack()
    fill(stack)
    host, disk, pool = stack.tiers
    gate = hold(stack)
    evict_block_0(stack)
    removed = {t.name: remove(t, key(0), how) for t in stack.tiers}  # SAM's remove_below
    assert removed == {"host": 0, "disk": 1, "pool": 0}  # the edit sees it freed
    assert not disk.contains(key(0)) and stack.lookup([key(0)]) == [None]
    gate.set()
    stack.flush()
    assert stack.lookup([key(0)]) == [None] and not pool.known(key(0))
    assert not pool.contains(key(0))  # nor in the shared pool itself
    s = stack.stats()
    assert s.num_dropped == 1 and s.num_cascaded == 3  # its eviction reported once, no bytes
    assert disk.stats().num_evicted == 1 and disk.stats().num_removed == 0  # counted once
    # cancelled before the read: nothing read, and nothing failed
    assert s.transfers.blocks_moved.get("disk->pool", 0) == 0 and s.transfers.num_failed == 0
    stack.check_integrity()


def test_a_load_waiting_on_a_leaving_block_that_is_then_removed_gets_its_bytes(make_stack):
    stack = make_stack()  # as for a disk block removed mid-read (`Tier.remove`)
    fill(stack)
    _, disk, pool = stack.tiers
    gate = hold(stack)
    evict_block_0(stack)
    dst = empty()
    loading = stack.load(key(0), dst)  # waits on the queued read-back
    assert disk.remove_many([key(0)]) == 1
    gate.set()
    assert loading.result(timeout=10) and same(dst, payload(0))
    stack.flush()
    assert not pool.known(key(0)) and stack.stats().num_dropped == 1  # still never handed down
    assert stack.stats().transfers.blocks_moved.get("disk->pool") == 1  # read for the load
    stack.check_integrity()


def test_a_block_removed_during_its_read_back_never_reaches_the_pool(make_stack):
    stack = make_stack()
    fill(stack)
    _, disk, pool = stack.tiers
    reading, go = threading.Event(), threading.Event()
    read_back = disk._read_back

    def paused(k: bytes):  # the real read, then a pause before the hand-down goes on
        out = read_back(k)
        reading.set()
        go.wait(30)
        return out

    disk._read_back = paused
    evict_block_0(stack)
    assert reading.wait(10)
    assert disk.remove_many([key(0)]) == 1
    go.set()
    stack.flush()
    assert stack.lookup([key(0)]) == [None] and not pool.known(key(0))
    s = stack.stats()
    assert s.num_dropped == 1 and s.num_cascaded == 3  # reported once: by the remove
    stack.check_integrity()


def test_a_hand_down_the_closed_mover_never_runs_releases_the_block(make_stack):
    stack = make_stack()
    fill(stack)
    _, disk, pool = stack.tiers
    stack.mover.close()
    disk.put([(key(5), payload(5))])  # evicts 0: its hand-down cannot run (nor this write)
    assert disk.stats().num_evicted == 1
    assert not disk.contains(key(0)) and stack.lookup([key(0)]) == [None]
    assert not (disk.directory / f"{key(0).hex()}.kv").exists()
    assert stack.stats().num_dropped == 1  # its eviction reported, with no bytes
    dst = empty()
    assert disk.get(key(0), dst).result(timeout=10) is False
    disk.check_integrity()


def test_a_hand_down_that_raises_releases_the_block(make_stack):
    stack = make_stack()
    fill(stack)
    _, disk, pool = stack.tiers

    def broken(k: bytes):  # a fault the read-back does not expect
        raise RuntimeError("injected")

    disk._read_back = broken
    evict_block_0(stack)
    stack.flush()
    assert not disk.contains(key(0)) and stack.lookup([key(0)]) == [None]
    assert stack.stats().num_dropped == 1 and stack.stats().transfers.num_failed == 1
    dst = empty()
    assert stack.load(key(0), dst).result(timeout=10) is False
    stack.check_integrity()  # the file unlinked, nothing left leaving


def test_a_block_being_handed_down_is_still_found_and_served(make_stack):
    stack = make_stack()
    fill(stack)
    _, disk, pool = stack.tiers
    gate = hold(stack)
    evict_block_0(stack)
    # not in no tier: 0 leaving, 1 and 2 on disk, 3 and 4 in host (4 still being written)
    assert stack.lookup_run([key(i) for i in range(5)]) == ["disk"] * 3 + ["host"] * 2
    dst = empty()
    loading = stack.load(key(0), dst)
    gate.set()
    assert loading.result(timeout=10) and same(dst, payload(0))
    stack.flush()
    assert stack.lookup([key(0)]) == ["pool"] and pool.stats().num_puts == 1
    assert disk.stats().num_hits == 1  # served by the disk, from the bytes read back
    got = empty()
    assert stack.load(key(0), got).result(timeout=10) and same(got, payload(0))
    stack.check_integrity()


def test_a_block_put_again_while_leaving_is_removed_with_its_hand_down(make_stack):
    stack = make_stack()
    fill(stack)
    _, disk, pool = stack.tiers
    gate = hold(stack)
    evict_block_0(stack)
    writing = disk.put([(key(0), payload(0))])[0]  # back down from host: an entry again, its
    assert stack.lookup([key(0)]) == ["disk"]       # write after the read-back and unlink
    assert disk.remove_many([key(0)]) == 1  # the entry and the hand-down: one block
    gate.set()
    writing.result(timeout=10)
    stack.flush()
    assert stack.lookup([key(0)]) == [None] and not pool.known(key(0))
    assert stack.stats().num_dropped == 1  # the eviction reported once, with no bytes
    assert disk.stats().num_removed == 1
    stack.check_integrity()  # the new file removed too


def test_a_block_the_pool_already_has_is_not_read_back(make_stack):
    stack = make_stack()
    _, disk, pool = stack.tiers
    assert all(f.result(timeout=10) for f in pool.put([(key(0), payload(0))]))  # write-through
    under_disk_lock = []
    call = pool._call

    def spied(fn, *args):  # the decision reads the pool's index: no backend call under the disk
        under_disk_lock.append(disk._lock._is_owned())  # lock (docs/structure.md, lock order)
        return call(fn, *args)

    pool._call = spied
    fill(stack, 6)  # the disk evicts 0 (the pool has it) and 1 (it does not)
    assert disk.stats().num_evicted == 2 and not any(under_disk_lock)
    assert stack.stats().transfers.blocks_moved.get("disk->pool") == 1  # 1 read back, not 0
    assert pool.stats().num_puts == 2 and stack.stats().num_dropped == 0
    assert stack.lookup([key(0), key(1)]) == ["pool", "pool"]
    stack.check_integrity()


def test_each_read_back_is_counted_as_a_disk_to_pool_transfer(make_stack):
    stack = make_stack(keep=lambda k: k != key(1))
    fill(stack, 6)  # the disk evicts 0 (kept: read back) and 1 (not kept: never read)
    moved = stack.stats().transfers
    assert moved.blocks_moved.get("disk->pool") == 1
    assert moved.bytes_moved.get("disk->pool") == LAYOUT.nbytes
    assert stack.lookup([key(0), key(1)]) == ["pool", None]


def test_the_keep_decision_is_made_once_at_eviction(make_stack):
    kept = {key(i) for i in range(6)}
    stack = make_stack(keep=kept.__contains__)
    fill(stack)
    _, _, pool = stack.tiers
    gate = hold(stack)
    evict_block_0(stack)  # kept when evicted: its hand-down is queued
    kept.discard(key(0))  # the session lets go before it lands; no remove was asked
    gate.set()
    stack.flush()
    assert pool.known(key(0)) and stack.stats().num_cascaded == 4
    kept.discard(key(1))  # not kept when evicted: reported at once, never read back
    gate = hold(stack)
    stack.store([(key(5), payload(5))])  # host evicts 3 -> disk evicts 1
    kept.add(key(1))
    gate.set()
    stack.flush()
    assert not pool.known(key(1)) and stack.stats().num_dropped == 1
    assert stack.stats().transfers.blocks_moved.get("disk->pool") == 1
    stack.check_integrity()
