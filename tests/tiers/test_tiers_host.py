"""HostTier: exact round trips, LRU and plugged victim order, capacity, no slot leaks."""

from __future__ import annotations

import threading

import pytest
import torch

from hintkv.tiers.host import HostTier
from hintkv.tiers.mover import Mover
from hintkv.tiers.ranks import RankBoard


def _results(futures):
    return [f.result() for f in futures]


def test_put_then_get_round_trips_exact_bytes(layout, key, payload, empty):
    host = HostTier(layout, 4 * layout.nbytes)
    assert host.capacity_blocks == 4
    blocks = {key(i): payload(i) for i in range(3)}
    assert _results(host.put(list(blocks.items()))) == [True] * 3
    for k, t in blocks.items():
        dst = empty()
        assert host.get(k, dst).result() is True
        assert torch.equal(dst.view(torch.int16), t.view(torch.int16))
    assert host.get(key(99), empty()).result() is False
    u = host.usage()
    assert (u.num_blocks, u.capacity_blocks, u.bytes_used) == (3, 4, 3 * layout.nbytes)
    s = host.stats()
    assert (s.num_puts, s.num_hits, s.num_misses) == (3, 3, 1)
    host.check_integrity()
    host.close()


def test_duplicate_put_is_a_noop_success(layout, key, payload, empty):
    host = HostTier(layout, 2 * layout.nbytes)
    first = payload(1)
    assert _results(host.put([(key(1), first), (key(1), payload(2))])) == [True, True]
    assert _results(host.put([(key(1), payload(3))])) == [True]
    dst = empty()
    host.get(key(1), dst).result()
    assert torch.equal(dst, first)  # the first bytes stay: same key means same content
    assert host.usage().num_blocks == 1 and host.stats().num_puts == 1
    host.close()


def test_full_tier_evicts_least_recently_used_and_reports_it(layout, key, payload, empty):
    evicted: list[tuple[bytes, torch.Tensor]] = []
    host = HostTier(layout, 3 * layout.nbytes,
                    on_evict=lambda k, view: evicted.append((k, view.clone())))
    for i in range(3):
        host.put([(key(i), payload(i))])[0].result()
    host.get(key(0), empty()).result()  # 0 is now more recent than 1 and 2
    host.put([(key(3), payload(3)), (key(4), payload(4))])
    host.flush()
    assert [k for k, _ in evicted] == [key(1), key(2)]
    assert torch.equal(evicted[0][1], payload(1))  # the listener saw the evicted bytes
    assert [host.contains(key(i)) for i in range(5)] == [True, False, False, True, True]
    assert host.stats().num_evicted == 2
    host.check_integrity()
    host.close()


def test_a_re_put_in_the_same_batch_is_not_the_victim(layout, key, payload):
    host = HostTier(layout, 2 * layout.nbytes)
    host.put([(key(0), payload(0)), (key(1), payload(1))])
    host.flush()  # key 0 is the least recently used...
    assert [f.result() for f in host.put([(key(0), payload(0)), (key(2), payload(2))])] == [
        True, True]
    assert host.contains(key(0)) and not host.contains(key(1))  # ...but was just put again
    host.check_integrity()
    host.close()


def test_published_classes_decide_victims(layout, key, payload):
    board = RankBoard()
    host = HostTier(layout, 3 * layout.nbytes, ranks=board)
    board.publish({key(0): 2, key(1): 1})  # known before they are stored: entries start there
    for i in range(6):
        host.put([(key(i), payload(i))])[0].result()
    assert host.contains(key(0)) and host.contains(key(1)) and host.contains(key(5))
    board.publish({key(5): 3})  # moved up after being stored: class 1 is now the lowest
    host.put([(key(6), payload(6))])[0].result()
    assert not host.contains(key(1)) and host.contains(key(0)) and host.contains(key(5))
    board.publish({key(0): None})  # nobody holds it now: class 0, newest there (LRU inside)
    host.put([(key(7), payload(7))])[0].result()
    assert not host.contains(key(6)) and host.contains(key(0)) and host.contains(key(5))
    host.check_integrity()
    host.close()


def test_batch_beyond_capacity_fails_the_excess(layout, key, payload):
    host = HostTier(layout, 2 * layout.nbytes)
    assert _results(host.put([(key(i), payload(i)) for i in range(4)])) == [True, True,
                                                                              False, False]
    assert host.stats().num_put_failed == 2
    zero = HostTier(layout, layout.nbytes - 1)
    assert zero.capacity_blocks == 0 and _results(zero.put([(key(0), payload(0))])) == [False]
    host.check_integrity()
    zero.check_integrity()
    host.close()
    zero.close()


def test_blocks_being_written_are_not_evicted(layout, key, payload):
    mover = Mover(num_workers=1)
    gate = threading.Event()
    mover.run(None, lambda: gate.wait(10), 0, 0)  # holds the only worker
    host = HostTier(layout, 1 * layout.nbytes, mover=mover)
    pending = host.put([(key(0), payload(0))])
    refused = host.put([(key(1), payload(1))])
    assert refused[0].result() is False and not pending[0].done()
    gate.set()
    assert pending[0].result() is True and host.contains(key(0))
    host.check_integrity()
    host.close()
    mover.close()


def test_blocks_of_a_batch_still_being_written_are_not_evicted(layout, key, payload):
    mover = Mover(num_workers=1)
    gate = threading.Event()
    mover.run(None, lambda: gate.wait(10), 0, 0)  # holds the only worker
    host = HostTier(layout, 2 * layout.nbytes, mover=mover)
    pending = host.put([(key(0), payload(0)), (key(1), payload(1))])  # one batch, in flight
    refused = host.put([(key(2), payload(2))])
    assert refused[0].result() is False and not any(f.done() for f in pending)
    gate.set()
    assert all(f.result() is True for f in pending)
    assert host.contains(key(0)) and host.contains(key(1)) and not host.contains(key(2))
    host.check_integrity()
    host.close()
    mover.close()


def test_get_of_a_block_still_being_written_waits_for_the_write(layout, key, payload, empty):
    mover = Mover(num_workers=1)
    gate = threading.Event()
    mover.run(None, lambda: gate.wait(10), 0, 0)
    host = HostTier(layout, 2 * layout.nbytes, mover=mover)
    host.put([(key(0), payload(0))])
    dst = empty()
    got = host.get(key(0), dst)
    gate.set()
    assert got.result() is True and torch.equal(dst, payload(0))
    host.close()
    mover.close()


def test_remove_frees_the_slot(layout, key, payload):
    host = HostTier(layout, 2 * layout.nbytes)
    host.put([(key(0), payload(0)), (key(1), payload(1))])
    host.flush()
    assert host.remove(key(0)) is True and host.remove(key(0)) is False
    assert host.usage().num_blocks == 1
    assert host.put([(key(2), payload(2))])[0].result() is True  # no eviction needed
    assert host.stats().num_evicted == 0 and host.stats().num_removed == 1
    for k in [*host.keys()]:
        host.remove(k)
    assert host.usage().num_blocks == 0
    host.check_integrity()
    host.close()


def test_rejects_payloads_of_another_layout(layout, key):
    host = HostTier(layout, layout.nbytes)
    with pytest.raises(ValueError):
        host.put([(key(0), torch.zeros(3))])
    host.close()


def test_blocks_joining_a_group_go_to_its_front_tail_first(layout, key, payload):
    """As in the device pool: a delta lists a session's regrouped blocks head first; each goes
    to the FRONT of its new group, so the group is reclaimed tail first, and its new blocks
    before the ones it held already (a head never goes before its own tail)."""
    from hintkv.tiers.ranks import RankDelta
    evicted: list[bytes] = []
    board = RankBoard()
    host = HostTier(layout, 4 * layout.nbytes, ranks=board,
                    on_evict=lambda k, _view: evicted.append(k))
    board.publish(RankDelta({key(9): "g"}, {"g": 1}))
    assert host.put([(key(9), payload(9))])[0].result()
    assert all(f.result() for f in host.put([(key(i), payload(i)) for i in range(3)]))  # unheld
    board.publish(RankDelta({key(0): "g", key(1): "g", key(2): "g"}))  # head first
    host.put([(key(10 + i), payload(i)) for i in range(4)])  # evicts all four of group g
    host.flush()
    assert evicted == [key(2), key(1), key(0), key(9)]
    host.check_integrity()
    host.close()
