"""HostTier batched puts: a write-down batch is one transfer with ONE future, exact bytes, and a
batch that fails leaves no entry, slot or pending I/O behind."""

from __future__ import annotations

import threading

import torch

from hintkv.tiers.host import HostTier
from hintkv.tiers.mover import Mover


def test_a_batch_put_is_one_future_and_stores_exact_bytes(layout, key, payload, empty):
    host = HostTier(layout, 8 * layout.nbytes)
    items = [(key(i), payload(i)) for i in range(5)] + [(key(2), payload(2))]  # one twice
    futures = host.put(items)
    assert len(futures) == 6 and len({id(f) for f in futures}) == 1  # one future for the batch
    assert futures[0].result() is True
    for i in range(5):
        dst = empty()
        assert host.get(key(i), dst).result() is True
        assert torch.equal(dst.view(torch.int16), payload(i).view(torch.int16))
    s = host.stats()
    assert (s.num_puts, s.num_put_failed) == (5, 0)
    moved = host.mover.stats()
    assert moved.blocks_moved["device->host"] == 5
    assert moved.bytes_moved["device->host"] == 5 * layout.nbytes
    # a re-put of held keys next to new ones: the held keep their future, the new share one
    again = host.put([(key(0), payload(0)), (key(7), payload(7)), (key(8), payload(8))])
    assert again[0] is futures[0] and again[1] is again[2] and again[1] is not futures[0]
    assert all(f.result() for f in again)
    host.flush()
    host.check_integrity()
    host.close()


def test_a_batch_over_capacity_stores_what_fits_and_fails_the_rest(layout, key, payload):
    host = HostTier(layout, 3 * layout.nbytes)
    futures = host.put([(key(i), payload(i)) for i in range(5)])
    assert [f.result() for f in futures] == [True, True, True, False, False]
    assert host.usage().num_blocks == 3 and host.stats().num_put_failed == 2
    host.check_integrity()
    host.close()


def test_a_failed_batch_leaves_nothing_behind(layout, key, payload):
    mover = Mover(num_workers=1)
    host = HostTier(layout, 4 * layout.nbytes, mover=mover)
    mover.close()  # the transfer cannot run: the batch resolves False
    futures = host.put([(key(i), payload(i)) for i in range(3)])
    assert [f.result() for f in futures] == [False] * 3
    host.flush()  # no pending I/O is left on the freed slots
    assert host.usage().num_blocks == 0 and not any(host.contains(key(i)) for i in range(3))
    assert host.stats().num_put_failed == 3 and host.stats().num_puts == 0
    host.check_integrity()


def test_a_batch_reusing_a_slot_waits_for_the_read_of_its_old_content(layout, key, payload,
                                                                       empty):
    mover = Mover(num_workers=2)
    host = HostTier(layout, 2 * layout.nbytes, mover=mover)
    assert all(f.result() for f in host.put([(key(0), payload(0)), (key(1), payload(1))]))
    gates = [threading.Event(), threading.Event()]
    for g in gates:  # both workers busy: the read below is queued, not done
        mover.run(None, lambda g=g: g.wait(10), 0, 0)
    dst = empty()
    read = host.get(key(0), dst)
    assert host.remove(key(0)) and host.remove(key(1))  # both slots free, a read still pending
    batch = host.put([(key(2), payload(2)), (key(3), payload(3))])  # reuses both slots
    for g in gates:
        g.set()
    assert read.result() is True and torch.equal(dst, payload(0))  # the old bytes, not key 2's
    assert all(f.result() for f in batch)
    for i in (2, 3):
        out = empty()
        assert host.get(key(i), out).result() and torch.equal(out, payload(i))
    host.flush()
    host.check_integrity()
    host.close()
    mover.close()
