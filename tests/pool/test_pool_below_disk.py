"""The whole chain host -> disk -> pool through the real tiers: a block the disk tier evicts is
written down to the pool (read back from its file, MAC checked), not lost; a block no live
session holds is not read back nor written; a disk file that went bad on the way is dropped,
never written down. Each backend, the real Mooncake master included."""

from __future__ import annotations

import pytest
import torch

from hintkv.tiers.disk import DiskTier
from hintkv.tiers.disk_format import HEADER_SIZE
from hintkv.tiers.host import HostTier
from hintkv.tiers.mover import Mover
from hintkv.tiers.pool import PoolTier
from hintkv.tiers.stack import TierStack
from tests.pool.blocks import FRAME, LAYOUT, key, payload, same


@pytest.fixture
def make_stack(make_pool_backend, prefix, tmp_path):
    """host (2 blocks) -> disk (2 blocks) -> pool (16 blocks); closed after the test."""
    made = []

    def make(**kw) -> TierStack:
        mover = Mover(num_workers=2)
        pool = PoolTier(LAYOUT, make_pool_backend(FRAME), 16 * FRAME, key_prefix=prefix)
        stack = TierStack([HostTier(LAYOUT, 2 * LAYOUT.nbytes, mover=mover),
                           DiskTier(LAYOUT, tmp_path / "disk", 2 * (HEADER_SIZE + LAYOUT.nbytes),
                                    mover=mover),
                           pool], mover=mover, owns_mover=True, **kw)
        made.append(stack)
        return stack

    yield make
    for s in made:
        s.close()


def load(stack: TierStack, k: bytes) -> torch.Tensor | None:
    dst = torch.empty(LAYOUT.shape, dtype=LAYOUT.dtype)
    return dst if stack.load(k, dst).result(timeout=10) else None


def store_one_by_one(stack: TierStack, n: int) -> None:
    for i in range(n):
        assert stack.store([(key(i), payload(i))])[0].result(timeout=10)
        stack.flush()  # each eviction's write-down lands before the next store


def test_a_block_evicted_from_disk_is_written_down_to_the_pool(make_stack):
    stack = make_stack()
    store_one_by_one(stack, 6)  # blocks 0, 1 leave the disk; 2, 3 on disk; 4, 5 in host
    host, disk, pool = stack.tiers
    assert disk.stats().num_evicted == 2
    assert stack.lookup([key(i) for i in range(6)]) == ["pool", "pool", "disk", "disk",
                                                        "host", "host"]
    assert pool.stats().num_puts == 2 and pool.usage().num_blocks == 2
    assert stack.stats().num_cascaded == 6 and stack.stats().num_dropped == 0
    for i in range(6):  # byte-exact from whichever tier holds it
        assert same(load(stack, key(i)), payload(i)), i
    stack.flush()
    assert pool.stats().num_hits >= 2
    stack.check_integrity()


def test_blocks_nobody_keeps_are_not_read_back(make_stack):
    kept = {key(i) for i in range(6)}
    stack = make_stack(keep=lambda k: k in kept)
    store_one_by_one(stack, 4)  # 0, 1 on disk; 2, 3 in host
    _, disk, pool = stack.tiers
    path = disk.directory / f"{key(0).hex()}.kv"
    path.write_bytes(path.read_bytes()[:-7])  # read back, it would count as corrupt
    kept.discard(key(0))  # its session ended
    assert stack.store([(key(4), payload(4))])[0].result(timeout=10)  # disk evicts 0
    stack.flush()
    assert disk.stats().num_corrupt == 0 and stack.stats().num_dropped == 1
    assert not path.exists() and not pool.contains(key(0))
    assert stack.store([(key(5), payload(5))])[0].result(timeout=10)  # disk evicts 1: kept
    stack.flush()
    assert stack.lookup([key(0), key(1)]) == [None, "pool"]
    assert pool.usage().num_blocks == 1 and same(load(stack, key(1)), payload(1))
    stack.check_integrity()


def test_a_damaged_file_is_dropped_not_written_down(make_stack):
    stack = make_stack()
    store_one_by_one(stack, 4)  # 0, 1 on disk; 2, 3 in host
    _, disk, pool = stack.tiers
    path = disk.directory / f"{key(0).hex()}.kv"
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE + 3] ^= 0x01
    path.write_bytes(bytes(data))
    assert stack.store([(key(4), payload(4))])[0].result(timeout=10)  # disk evicts 0
    stack.flush()
    assert not pool.contains(key(0)) and load(stack, key(0)) is None
    assert disk.stats().num_corrupt == 1 and stack.stats().num_dropped == 1
    assert not path.exists()
    stack.check_integrity()
