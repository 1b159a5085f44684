"""Random workloads on a host+disk stack: capacities hold, integrity holds after every step,
every load that succeeds returns the exact bytes, and removing everything leaks nothing."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hintkv.tiers.disk import DiskTier
from hintkv.tiers.disk_format import HEADER_SIZE, SECRET_FILE
from hintkv.tiers.host import HostTier
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.ranks import RankBoard
from hintkv.tiers.stack import TierStack

LAYOUT = BlockLayout(1, 2, 1, 4, torch.float16)
NUM_KEYS = 12


def make_key(i: int) -> bytes:
    return hashlib.blake2b(f"block-{i}".encode(), digest_size=16).digest()


def make_payload(layout: BlockLayout, i: int) -> torch.Tensor:
    return torch.full(layout.shape, float(i), dtype=layout.dtype)  # content follows the key

_ops = st.one_of(
    st.tuples(st.just("store"), st.lists(st.integers(0, NUM_KEYS - 1), min_size=1, max_size=4)),
    st.tuples(st.just("load"), st.integers(0, NUM_KEYS - 1)),
    st.tuples(st.just("remove"), st.integers(0, NUM_KEYS - 1)),
    st.tuples(st.just("remove_disk"), st.integers(0, NUM_KEYS - 1)),
    st.tuples(st.just("keep"), st.sets(st.integers(0, NUM_KEYS - 1))),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(host_blocks=st.integers(0, 3), disk_blocks=st.integers(0, 5),
       classes=st.dictionaries(st.integers(0, NUM_KEYS - 1), st.integers(0, 3)),
       ops=st.lists(_ops, max_size=25))
def test_capacity_and_integrity_hold_under_random_workload(host_blocks, disk_blocks,
                                                          classes, ops):
    with tempfile.TemporaryDirectory() as d:
        host = HostTier(LAYOUT, host_blocks * LAYOUT.nbytes)
        disk = DiskTier(LAYOUT, d, disk_blocks * (HEADER_SIZE + LAYOUT.nbytes))
        board = RankBoard()  # random classes, republished as ops run: invariants must hold
        disk.set_ranks(board)
        board.publish({make_key(i): c for i, c in classes.items()})
        kept: set[int] = set(range(NUM_KEYS))
        stack = TierStack([host, disk], keep=lambda k: k in {make_key(i) for i in kept})
        for op, arg in ops:
            if op == "store":
                items = [(make_key(i), make_payload(LAYOUT, i)) for i in arg]
                for f in stack.store(items):
                    f.result()
            elif op == "load":
                dst = torch.empty(LAYOUT.shape, dtype=LAYOUT.dtype)
                if stack.load(make_key(arg), dst).result():
                    assert torch.equal(dst, make_payload(LAYOUT, arg))
            elif op == "remove":
                stack.remove_everywhere(make_key(arg))
            elif op == "remove_disk":
                disk.remove(make_key(arg))
            else:
                kept = set(arg)
                board.publish({make_key(i): (i % 3 if i in kept else None)
                               for i in range(NUM_KEYS)})
            host.flush()
            stack.check_integrity()
            for u in stack.usage().values():
                assert u.num_blocks <= u.capacity_blocks
        for i in range(NUM_KEYS):
            stack.remove_everywhere(make_key(i))
        stack.check_integrity()
        assert all(u.num_blocks == 0 for u in stack.usage().values())
        stack.close()
        assert [p for p in Path(d).iterdir() if p.name != SECRET_FILE] == []
