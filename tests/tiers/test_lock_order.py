"""Lock order of the tier stack under concurrent use: writers (store: evictions cascade down
the stack under the tiers' locks), loaders (lower-tier hits promoted back up from a mover's
callback), scrapers (stats and usage, as /metrics), removers and a rank publisher all run at
once through real host, disk and pool tiers, every lock of theirs wrapped by a recorder
(`lock_order.LockOrder`). The graph of "held -> taken" must have no cycle, whatever this run's
interleaving was: 7a4c269's deadlock (stats held the stack lock waiting for the host's, an
eviction held the host's calling the stack) is such a cycle, found here without hitting it.

The order these tests hold the code to (docs/structure.md, "Lock order"):
    host -> disk -> pool -> pool.queue ; any tier -> stack, board, breaker, mover (leaves)
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from hintkv.pool.backend import make_backend
from hintkv.tiers.disk import DiskTier
from hintkv.tiers.disk_format import HEADER_SIZE
from hintkv.tiers.host import HostTier
from hintkv.tiers.mover import Mover
from hintkv.tiers.pool import PoolTier
from hintkv.tiers.ranks import RankBoard, RankDelta
from hintkv.tiers.stack import TierStack
from lock_order import LockOrder, guarded

JOIN_S = 60  # threads still running after this are stuck: reported, never waited on forever


def _tracked_pool(order: LockOrder, layout, blocks: int) -> PoolTier:
    """A real pool tier whose locks are wrapped before its worker thread starts (the worker
    waits on the queue's condition from then on)."""
    class Tracked(PoolTier):
        def _start_worker(self):
            order.track(self, "_lock", "pool")
            order.track(self, "_cv", "pool.queue")
            order.track(self, "_calls_cv", "pool.calls")
            order.track(self.breaker, "_lock", "breaker")
            order.track(self.backend, "_lock", "backend")
            return super()._start_worker()
    frame = HEADER_SIZE + layout.nbytes
    return Tracked(layout, make_backend("embedded", frame), blocks * frame)


def _stack(order: LockOrder, layout, tmp_path, shape: str) -> tuple[TierStack, RankBoard]:
    mover = Mover(num_workers=2)
    tiers = []
    if "host" in shape:
        tiers.append(HostTier(layout, 6 * layout.nbytes, mover=mover))
    if "disk" in shape:
        tiers.append(DiskTier(layout, tmp_path, 10 * (HEADER_SIZE + layout.nbytes), mover=mover))
    if "pool" in shape:
        tiers.append(_tracked_pool(order, layout, 14))
    stack = TierStack(tiers, mover=mover, owns_mover=True)
    board = RankBoard(grouped=True)
    stack.set_keep(board.held)
    for t in tiers:
        t.set_ranks(board)
        if t.name != "pool":
            order.track(t, "_lock", t.name)
    order.track(stack, "_lock", "stack")
    order.track(board, "_lock", "board")
    order.track(mover, "_lock", "mover")
    return stack, board


def _run(threads: list[threading.Thread]) -> list[str]:
    """Start them; the names of those not finished within JOIN_S in all."""
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


@pytest.mark.parametrize("shape", ["host+disk", "host+pool", "host+disk+pool"])
def test_no_lock_order_cycle_under_concurrent_store_load_scrape(layout, key, payload, tmp_path,
                                                               shape):
    order = LockOrder()
    stack, board = _stack(order, layout, tmp_path, shape)
    n_keys, rounds = 40, 150
    keys = [key(i) for i in range(n_keys)]
    payloads = [payload(i) for i in range(n_keys)]
    errors: list[BaseException] = []

    def writer():
        rng = random.Random(1)
        for _ in range(rounds):
            picks = rng.sample(range(n_keys), 3)
            for f in stack.store([(keys[i], payloads[i]) for i in picks]):
                f.result(timeout=30)

    def loader():
        rng = random.Random(2)
        dst = torch.empty((4, *layout.shape), dtype=layout.dtype)
        for r in range(rounds):
            picks = rng.sample(range(n_keys), 4)
            got = stack.load_many([keys[i] for i in picks], dst).result(timeout=30)
            for i, ok in zip(picks, got):  # a hit is the block itself, whichever tier held it
                assert not ok or torch.equal(dst[picks.index(i)].view(torch.int16),
                                             payloads[i].view(torch.int16))
            if r % 3 == 0:
                stack.load(keys[picks[0]], dst[0]).result(timeout=30)

    def scraper():
        for _ in range(rounds):
            stack.stats()
            stack.usage()
            stack.lookup_run(keys)
            for t in stack.tiers:
                if isinstance(t, PoolTier):
                    t.pool_stats()

    def publisher():
        rng = random.Random(3)
        for r in range(rounds):  # sessions (groups) take and drop blocks and change class
            blocks = {keys[i]: (None if rng.random() < 0.2 else f"g{rng.randrange(5)}")
                      for i in rng.sample(range(n_keys), 6)}
            board.publish(RankDelta(blocks, {f"g{rng.randrange(5)}": rng.randrange(4)}))
            if r % 10 == 0:
                for t in stack.tiers:
                    t.remove_many([keys[rng.randrange(n_keys)]])

    threads = [threading.Thread(target=guarded(fn, errors), name=fn.__name__, daemon=True)
               for fn in (writer, loader, scraper, publisher)]
    stuck = _run(threads)
    assert not stuck, f"threads {stuck} never finished (deadlock?)\n{order.explain()}"
    assert not errors, errors
    assert order.cycle() is None, order.explain()
    # the paths the order is about were taken (else the test proves nothing)
    top = stack.tiers[0].name
    assert (top, "stack") in order.edges, order.explain()  # an eviction's callback
    assert (top, stack.tiers[1].name) in order.edges, order.explain()  # a cascade
    if "disk" in shape and "pool" in shape:  # a disk eviction asks the pool (`known`), and a
        assert ("disk", "pool") in order.edges, order.explain()  # hand-down puts into it,
        assert ("disk", "pool.queue") in order.edges, order.explain()  # queued under its lock
    stack.flush()
    stack.check_integrity()
    stack.close()


def test_the_recorder_finds_an_inversion_no_run_deadlocked_on():
    """Two locks taken in both orders, by two threads one after the other (never at once, so
    nothing deadlocks): the recorder reports the cycle, with where each edge was taken."""
    class Holder:
        def __init__(self):
            self.a = threading.Lock()
            self.b = threading.RLock()
    h = Holder()
    order = LockOrder()
    order.track(h, "a", "a")
    order.track(h, "b", "b")

    def ab():
        with h.a, h.b, h.b:  # reentrant: no b -> b edge
            pass

    def ba():
        with h.b, h.a:
            pass
    for fn in (ab, ba):
        t = threading.Thread(target=fn)
        t.start()
        t.join()
    assert set(order.edges) == {("a", "b"), ("b", "a")}
    assert order.cycle() in (["a", "b", "a"], ["b", "a", "b"])
    assert "in ab" in order.explain() and "in ba" in order.explain()
