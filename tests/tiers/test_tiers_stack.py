"""TierStack: offload from the device pool then prefetch back, byte-exact, through host and disk;
keep/drop decisions on eviction; fall-through on a corrupt block; accounting per direction."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.disk import DiskTier
from hintkv.tiers.disk_format import HEADER_SIZE, SECRET_FILE
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack


@pytest.fixture
def device():
    g = torch.Generator().manual_seed(3)
    caches = [torch.randn(2, 8, 4, 2, 8, generator=g).to(torch.bfloat16) for _ in range(2)]
    return DeviceBlockIO(caches)


def _stack(layout, tmp_path, host_blocks, disk_blocks, **kw):
    host = HostTier(layout, host_blocks * layout.nbytes)
    disk = DiskTier(layout, tmp_path, disk_blocks * (HEADER_SIZE + layout.nbytes))
    return TierStack([host, disk], **kw)


def test_offload_then_prefetch_round_trips_exact_bytes(device, key, tmp_path):
    layout = device.layout
    stack = _stack(layout, tmp_path, host_blocks=2, disk_blocks=8)
    ids = list(range(6))
    out = torch.empty(len(ids), *layout.shape, dtype=layout.dtype)
    device.read(ids, out)
    original = [kv.clone() for kv in device.kv_caches]
    for n, b in enumerate(ids):  # one at a time: each store past two pushes a block down
        assert stack.store([(key(b), out[n])])[0].result()
    stack.check_integrity()
    assert stack.lookup([key(b) for b in ids]) == ["disk"] * 4 + ["host"] * 2
    for kv in device.kv_caches:
        kv.zero_()  # the device blocks are reused by someone else
    back = torch.empty_like(out)
    loads = [stack.load(key(b), back[n]) for n, b in enumerate(ids)]
    assert stack.wait_loads(loads) == [True] * len(ids)
    device.write(ids, back)
    for kv, old in zip(device.kv_caches, original):
        assert torch.equal(kv[:, ids].view(torch.int16), old[:, ids].view(torch.int16))
    s = stack.stats()
    assert s.num_cascaded == 4 and s.num_dropped == 0
    assert s.transfers.blocks_moved == {"device->host": 6, "host->disk": 4, "disk->host": 4,
                                        "host->device": 6}
    assert s.transfers.bytes_moved["host->disk"] == 4 * layout.nbytes
    assert s.transfers.num_load_waits == 1
    stack.check_integrity()
    stack.close()


def test_a_batch_larger_than_the_host_spills_to_disk(layout, key, payload, empty, tmp_path):
    stack = _stack(layout, tmp_path, host_blocks=2, disk_blocks=8)
    futures = stack.store([(key(i), payload(i)) for i in range(5)])
    assert [f.result() for f in futures] == [True] * 5
    assert stack.lookup([key(i) for i in range(5)]) == ["host"] * 2 + ["disk"] * 3
    assert stack.stats().num_spilled == 3
    dst = empty()
    assert stack.load(key(4), dst).result() is True and torch.equal(dst, payload(4))
    stack.check_integrity()
    stack.close()


def test_blocks_nobody_holds_are_dropped_not_written(layout, key, payload, tmp_path):
    held = {key(1)}
    dropped: list[bytes] = []
    stack = _stack(layout, tmp_path, host_blocks=1, disk_blocks=4,
                   keep=lambda k: k in held, on_drop=dropped.append)
    for i in range(3):
        stack.store([(key(i), payload(i))])[0].result()
    stack.check_integrity()
    assert stack.lookup([key(0), key(1), key(2)]) == [None, "disk", "host"]
    assert dropped == [key(0)]
    assert stack.stats().num_dropped == 1 and stack.stats().num_cascaded == 1
    stack.close()


def test_disk_hit_is_promoted_when_host_has_room(layout, key, payload, empty, tmp_path):
    stack = _stack(layout, tmp_path, host_blocks=2, disk_blocks=4)
    for i in range(3):
        stack.store([(key(i), payload(i))])[0].result()
    stack.tiers[0].remove(key(2))  # frees a host slot; key 0 lives on disk only
    dst = empty()
    assert stack.load(key(0), dst).result() is True and torch.equal(dst, payload(0))
    stack.tiers[0].flush()
    assert stack.lookup([key(0)]) == ["host"] and stack.stats().num_promoted == 1
    stack.tiers[1].remove(key(0))
    dst = empty()
    assert stack.load(key(0), dst).result() is True and torch.equal(dst, payload(0))
    stack.check_integrity()
    stack.close()


def test_corrupt_disk_block_is_a_miss_for_the_stack(layout, key, payload, empty, tmp_path):
    stack = _stack(layout, tmp_path, host_blocks=1, disk_blocks=4)
    stack.store([(key(0), payload(0))])[0].result()
    stack.store([(key(1), payload(1))])[0].result()  # pushes key 0 down to disk
    stack.tiers[1].flush()
    path = tmp_path / f"{key(0).hex()}.kv"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert stack.load(key(0), empty()).result() is False
    assert stack.lookup([key(0)]) == [None]  # dropped, so the next lookup does not promise it
    assert stack.stats().tiers["disk"].num_corrupt == 1
    assert stack.load(key(7), empty()).result() is False
    stack.check_integrity()
    stack.close()


def test_remove_everywhere_and_usage(layout, key, payload, empty, tmp_path):
    stack = _stack(layout, tmp_path, host_blocks=2, disk_blocks=4)
    for i in range(3):
        stack.store([(key(i), payload(i))])[0].result()
    stack.tiers[1].put([(key(2), payload(2))])[0].result()  # key 2 on both tiers
    usage = stack.usage()
    assert usage["host"].num_blocks == 2 and usage["disk"].num_blocks == 2
    assert stack.remove_everywhere(key(2)) is True
    assert stack.remove_everywhere(key(2)) is False
    assert stack.lookup([key(2)]) == [None]
    stack.check_integrity()
    stack.close()
    assert [p for p in tmp_path.iterdir() if p.name != SECRET_FILE] == [tmp_path / f"{key(0).hex()}.kv"]


def test_stack_rejects_mismatched_tiers(layout, tmp_path):
    host = HostTier(layout, layout.nbytes)
    with pytest.raises(ValueError):
        TierStack([])
    with pytest.raises(ValueError):
        TierStack([host, HostTier(layout, layout.nbytes)])
    host.close()


def test_load_many_batches_host_hits_and_falls_through(layout, key, payload, tmp_path):
    """Host hits in one mover submission, a disk-only block and a block still being written
    one by one, a miss as False: every delivered block has its exact bytes, in key order."""
    stack = _stack(layout, tmp_path, host_blocks=4, disk_blocks=8)
    for i in range(5):  # 0 is pushed down to disk by 4
        stack.store([(key(i), payload(i))])[0].result()
    stack.flush()
    assert stack.lookup([key(0)]) == ["disk"]
    host = stack.tiers[0]
    keys = [key(3), key(0), key(99), key(1), key(2)]
    dst = torch.zeros((len(keys), *layout.shape), dtype=layout.dtype)
    got = stack.load_many(keys, dst).result()
    assert got == [True, True, False, True, True]
    for j, k in enumerate(keys):
        if got[j]:
            assert torch.equal(dst[j], payload([3, 0, 99, 1, 2][j])), f"row {j} has other bytes"
    stack.flush()
    assert host.mover.stats().blocks_moved.get("host->device", 0) >= 3
    # a block put and loaded at once: the batched read is ordered after its write
    fresh = payload(50)
    stack.store([(key(50), fresh)])
    dst = torch.zeros((2, *layout.shape), dtype=layout.dtype)
    assert stack.load_many([key(50), key(1)], dst).result() == [True, True]
    assert torch.equal(dst[0], fresh) and torch.equal(dst[1], payload(1))
    stack.check_integrity()
    stack.close()


def test_host_get_many_reads_ready_blocks_into_their_rows(layout, key, payload):
    host = HostTier(layout, 6 * layout.nbytes)
    for i in range(6):
        host.put([(key(i), payload(i))])[0].result()
    host.flush()
    before = host.mover.stats()
    dst = torch.zeros((8, *layout.shape), dtype=layout.dtype)
    got = host.get_many([key(5), key(2), key(0)], dst, [7, 0, 3]).result()
    assert got == [True, True, True]
    assert torch.equal(dst[7], payload(5)) and torch.equal(dst[0], payload(2)) \
        and torch.equal(dst[3], payload(0))
    host.flush()
    after = host.mover.stats()
    assert after.blocks_moved["host->device"] - before.blocks_moved.get("host->device", 0) == 3
    assert host.stats().num_hits == 3
    host.check_integrity()
    host.close()


def test_batched_probes_and_removals_match_the_one_by_one_ones(layout, key, payload, tmp_path):
    """`contains_many` / `remove_many` (one lock per call) answer as `contains` / `remove` do,
    and `lookup_run` is `lookup` up to its first miss, across chunk boundaries."""
    stack = _stack(layout, tmp_path, host_blocks=40, disk_blocks=8)
    for f in stack.store([(key(i), payload(i)) for i in range(40)]):
        assert f.result()
    for f in stack.tiers[1].put([(key(i), payload(i)) for i in range(40, 45)]):
        assert f.result()
    probe = [key(i) for i in (3, 50, 41, 0, 3)]
    for t in stack.tiers:
        assert t.contains_many(probe) == [t.contains(k) for k in probe]
    keys = [key(i) for i in range(45)] + [key(99)] + [key(1)]
    assert stack.lookup_run(keys) == ["host"] * 40 + ["disk"] * 5
    assert stack.lookup_run(keys, first=1) == stack.lookup_run(keys, first=7)
    assert stack.lookup_run([key(99), key(0)]) == []
    assert stack.lookup_run([]) == []
    host = stack.tiers[0]
    before = host.stats().num_removed
    assert host.remove_many([key(5), key(5), key(99), key(6)]) == 2  # a repeat is removed once
    assert host.stats().num_removed == before + 2
    assert host.contains_many([key(5), key(6), key(7)]) == [False, False, True]
    assert stack.lookup_run(keys) == ["host"] * 5
    stack.check_integrity()
    stack.close()


def test_stats_never_holds_the_stack_lock_while_it_waits_for_a_tier(device, tmp_path):
    """Lock order: a tier evicting under its own lock calls the stack (`_evicted` takes the stack's
    lock), so `stats` (a /metrics scrape) must not hold the stack's lock while it waits for a tier's.
    It did: a scrape during a host write-down that evicted deadlocked the server (engine thread in
    `_evicted`, the scrape in `HostTier.stats`)."""
    stack = _stack(device.layout, tmp_path, 2, 2)
    host = stack.tiers[0]
    with host._lock:  # a tier busy evicting holds its lock ...
        scrape = threading.Thread(target=stack.stats, daemon=True)
        scrape.start()
        time.sleep(0.2)  # ... while a scrape waits for it
        evict = threading.Thread(target=stack._evicted, args=(0, b"k" * 16, None), daemon=True)
        evict.start()  # ... and the eviction's callback needs the stack's lock
        evict.join(10)
        stuck = evict.is_alive()
    scrape.join(10)
    evict.join(10)
    assert not stuck, "an eviction's callback waited for the stack lock held by stats: deadlock"
    assert stack.stats().num_dropped == 1
    stack.close()
