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

import threading
import time

import pytest
import torch

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.cache.types import CacheEdit, SessionRef
from hintkv.cache.write_downs import MAX_GATHER_TRIES
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack

BS, NUM_BLOCKS = 4, 8


class World:
    def __init__(self, mode: str, offload: bool, device: str = "cpu") -> None:
        self.now = 100.0
        self.sessions = SessionRegistry()
        self.kv = KVCacheManager(NUM_BLOCKS, BS, make_policy("sam", sessions=self.sessions))
        self.io = DeviceBlockIO([torch.randn(2, NUM_BLOCKS, BS, 1, 2, device=device) for _ in range(2)])
        self.stack = TierStack([HostTier(self.io.layout, 64 * self.io.layout.nbytes, pin=device == "cuda")])
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

    def evicted_kv(self) -> tuple[list[int], torch.Tensor]:
        """The queued victims' device block ids and their KV as the pass evicted it (on the CPU), in the
        order of a's tail (`held[2:]`)."""
        queued = dict(self.tiers.write_downs._queue)
        bids = [queued[h] for h in self.held[2:]]
        out = torch.empty((len(bids), *self.io.layout.shape), dtype=self.io.layout.dtype, device=self.io.device)
        self.io.read(bids, out)
        return bids, out.cpu()

    def forward_over(self, bids: list[int]) -> None:
        """The step's forward pass writing the reused blocks (on CUDA: queued after the flush's gather)."""
        for layer in self.io.kv_caches:
            layer[:, bids] = 7.0

    def prefetched_kv(self) -> torch.Tensor:
        """The tail's KV as a landed prefetch registered it on the device."""
        ids = [self.kv.pool.lookup(h).block_id for h in self.held[2:]]
        out = torch.empty((len(ids), *self.io.layout.shape), dtype=self.io.layout.dtype, device=self.io.device)
        self.io.read(ids, out)
        return out.cpu()


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


def test_a_predicted_resume_prefetch_in_the_same_pass_loads_what_the_pass_evicted():
    """`prefetch` (SAM's predicted resume), not only the hint's `prefetch_counted` (review_scale22
    finding 3: that call site's flush was untested)."""
    w = World("deferred", offload=True)
    w.kv.pool.release(w.taken[-2:])
    scheduled, on_device = w.tiers.prefetch(w.held)
    assert (scheduled, on_device) == (2, 2)  # (was 0: the evicted tail was in no tier yet)
    w.tiers.close()


def test_a_hints_flush_on_another_thread_holds_the_engines_forward_until_gathered():
    """review_scale22 finding 1: a prefetch hint (a manage thread, under the state lock) flushed
    the queue while the engine, after `schedule()`, found it empty, passed `check_flushed` and ran
    its forward pass, which overwrote the victims before the hint's gather read them: the host
    stored the forward's bytes under the evicted blocks' hashes. Now the engine's flush waits for
    the other gather, and `check_flushed` counts a victim only once gathered."""
    w = World("deferred", offload=True)
    queued = list(w.tiers.write_downs._queue)  # a's evicted tail: (hash, device block id)
    bids = [b for _, b in queued]
    evicted = torch.empty((len(bids), *w.io.layout.shape), dtype=w.io.layout.dtype)
    w.io.read(bids, evicted)
    mark = w.tiers.write_downs.mark()
    started, go = threading.Event(), threading.Event()
    read = w.io.read

    def held_read(ids, out):  # the hint's gather, held open until the test lets it go
        if threading.current_thread().name == "manage":
            started.set()
            assert go.wait(10)
        read(ids, out)
    w.io.read = held_read
    manage = threading.Thread(target=lambda: w.tiers.prefetch_counted(w.held), name="manage")
    manage.start()
    assert started.wait(10)
    engine_done = threading.Event()

    def engine_step():  # LLMEngine.step after schedule(): flush, check, forward
        w.tiers.flush_write_downs()
        w.tiers.write_downs.check_flushed(mark)
        w.io.write(bids, torch.full_like(evicted, 7.0))
        engine_done.set()
    engine = threading.Thread(target=engine_step, name="engine")
    engine.start()
    assert not engine_done.wait(0.3)  # the forward waits for the hint's gather
    go.set()
    manage.join(10)
    engine.join(10)
    assert engine_done.is_set()
    w.stack.flush()
    for (h, _), kv in zip(queued, evicted):
        dst = torch.empty(w.io.layout.shape, dtype=w.io.layout.dtype)
        assert w.stack.load(h, dst).result()
        assert torch.equal(dst, kv)  # the evicted KV, not the forward's bytes
    w.stack.close()


class _CopyStreamEvent:
    """What `DeviceBlockIO.read_async` returns on CUDA: the gather is still on the copy stream."""

    def synchronize(self) -> None:
        time.sleep(0.05)


@pytest.mark.parametrize("mode, offload", [("deferred", True), ("lazy", False)])
def test_on_the_copy_stream_a_plan_still_finds_what_the_pass_evicted(mode, offload):
    """review_scale22 finding 2: with the gather on a copy stream (CUDA), the stack stores the
    victims later, on a mover thread; the look below counts them as held meanwhile."""
    w = World(mode, offload)
    read = w.io.read
    w.io.read_async = lambda ids, out, stream: (read(ids, out), _CopyStreamEvent())[1]
    assert w.tiers.plan(w.held[2:]) == ["host", "host"]  # (was []: the store had not landed)
    w.tiers.close()


def test_a_victim_counts_as_taken_only_once_its_gather_is_done():
    """review_race22 finding 5: a driver's `check_flushed` while another thread's flush is still
    gathering must raise (the forward would overwrite blocks still being read)."""
    w = World("deferred", offload=True)
    mark = w.tiers.write_downs.mark()
    started, go = threading.Event(), threading.Event()
    read = w.io.read

    def held_read(ids, out):
        started.set()
        assert go.wait(10)
        read(ids, out)
    w.io.read = held_read
    flusher = threading.Thread(target=w.tiers.flush_write_downs)
    flusher.start()
    assert started.wait(10)
    with pytest.raises(RuntimeError, match="not written down"):
        w.tiers.write_downs.check_flushed(mark)
    go.set()
    flusher.join(10)
    w.tiers.write_downs.check_flushed(mark)
    w.tiers.close()


class _HeldCopy:
    """A gather still on the copy stream until the test lets it land (`go`)."""

    def __init__(self, go: threading.Event) -> None:
        self.go = go

    def synchronize(self) -> None:
        assert self.go.wait(10)


def _land_prefetch(w: World) -> None:
    for p in list(w.tiers._prefetches):
        p.batch.result(10)
    w.tiers.poll()


def test_a_store_still_in_flight_is_held_for_a_look_below_and_its_load_waits_for_it():
    """review_race22 finding 2: on CUDA the engine's flush leaves its gather on the copy stream and
    a mover thread stores it once landed; a look below in between found the victims in no tier (a
    recompute). Now they are held by the top tier while storing, and a load of them starts only
    once their store is done: it reads the evicted KV, never a slot before its bytes land."""
    w = World("deferred", offload=True)
    tail = w.held[2:]
    bids, evicted = w.evicted_kv()
    go = threading.Event()
    read = w.io.read
    w.io.read_async = lambda ids, out, stream: (read(ids, out), _HeldCopy(go))[1]
    assert w.tiers.flush_write_downs() == 2  # the engine's flush, after schedule()
    w.forward_over(bids)
    downs = w.tiers.write_downs
    assert w.stack.lookup(tail) == [None, None]  # the store is still in flight
    assert downs.busy() and not w.tiers.idle()
    assert w.tiers.plan(tail) == ["host", "host"]  # (was []: in no tier yet)
    assert w.tiers.where(w.held) == {"device": 2, "host": 2}
    downs.queue([(tail[0], bids[0])])  # evicted again while storing: not gathered twice
    assert w.tiers.flush_write_downs() == 0
    w.kv.pool.release(w.taken[-2:])
    assert w.tiers.prefetch(w.held) == (2, 2)  # (was 0: nothing below to load)
    (p,) = w.tiers._prefetches
    assert not p.batch.done()  # waits for the store, not reading the empty slots
    go.set()
    _land_prefetch(w)
    assert w.on_device() == [True] * 4
    assert torch.equal(w.prefetched_kv(), evicted)  # the evicted KV, not the forward's
    assert not downs.busy() and downs._storing == {}
    w.tiers.close()


@pytest.mark.parametrize("look", ["plan", "prefetch hint"])
def test_a_look_below_waits_for_a_flush_running_on_another_thread(look):
    """The engine flushes outside the state lock; a look below under it (a prefetch hint on a manage thread,
    review_rev23_a finding 2) that found the queue already taken looked before that gather was stored."""
    w = World("deferred", offload=True)
    w.kv.pool.release(w.taken[-2:])  # room for the prefetch
    started, go = threading.Event(), threading.Event()
    read = w.io.read

    def held_read(ids, out):
        if threading.current_thread().name == "engine":
            started.set()
            assert go.wait(10)
        read(ids, out)
    w.io.read = held_read
    engine = threading.Thread(target=w.tiers.flush_write_downs, name="engine")
    engine.start()
    assert started.wait(10)
    got: list = []
    fn = (lambda: w.tiers.plan(w.held[2:])) if look == "plan" else (lambda: w.tiers.prefetch_counted(w.held))
    manage = threading.Thread(target=lambda: got.append(fn()), name="manage")
    manage.start()
    manage.join(0.3)
    assert manage.is_alive()  # waits for the engine's gather
    go.set()
    engine.join(10)
    manage.join(10)
    # (was [] and (0, 2, 0): the queue read empty, nothing stored yet)
    assert got == [["host", "host"] if look == "plan" else (2, 2, 2)]
    w.tiers.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_a_prefetch_right_after_the_engines_flush_loads_the_evicted_kv():
    """review_race22 finding 2 on CUDA: the mover's workers are held busy, so the engine flush's
    store waits behind them while the forward overwrites the blocks and a prefetch plans and loads
    the victims: it counts them held and its load lands the evicted KV."""
    w = World("deferred", offload=True, device="cuda")
    mover = w.stack.mover
    assert mover.copy_stream is not None
    bids, evicted = w.evicted_kv()
    go = threading.Event()
    busy = [mover.run(None, lambda: go.wait(10), 0, 0) for _ in range(mover._pool._max_workers)]
    assert w.tiers.flush_write_downs() == 2
    w.forward_over(bids)
    assert w.stack.lookup(w.held[2:]) == [None, None]  # stored only once a worker is free
    assert w.tiers.plan(w.held[2:]) == ["host", "host"]
    w.kv.pool.release(w.taken[-2:])
    assert w.tiers.prefetch(w.held) == (2, 2)
    go.set()
    assert all(f.result(10) for f in busy)
    _land_prefetch(w)
    assert w.on_device() == [True] * 4
    assert torch.equal(w.prefetched_kv(), evicted)
    w.tiers.close()


def test_a_failed_gather_leaves_its_victims_queued_and_the_forward_refused():
    """review_rev23_a finding 5: a gather that raised counted its victims as taken and dropped them, so
    `check_flushed` passed and the forward overwrote blocks never written down. Now they go back to the queue."""
    w = World("deferred", offload=True)
    mark = w.tiers.write_downs.mark()
    read = w.io.read

    def failing_read(ids, out):
        raise RuntimeError("device read failed")
    w.io.read = failing_read
    with pytest.raises(RuntimeError, match="device read failed"):
        w.tiers.flush_write_downs()
    with pytest.raises(RuntimeError, match="2 evicted blocks were not written down"):
        w.tiers.write_downs.check_flushed(mark)
    assert w.tiers.num_write_downs_queued == 2
    w.io.read = read
    assert w.tiers.flush_write_downs() == 2
    w.tiers.write_downs.check_flushed(mark)
    assert w.stack.lookup(w.held[2:]) == ["host", "host"]
    w.tiers.close()


def test_a_gather_that_keeps_failing_drops_its_victims_not_every_later_step():
    """review_rev23_b finding 3: with the victims of a raising gather queued again, a gather that always raises
    (a tier bug, a payload check) failed every step for good; after MAX_GATHER_TRIES in a row they are dropped
    (lost KV, logged, counted) and the forward runs."""
    w = World("deferred", offload=True)
    mark = w.tiers.write_downs.mark()

    def failing_read(ids, out):
        raise RuntimeError("device read failed")
    w.io.read = failing_read
    for _ in range(MAX_GATHER_TRIES - 1):
        with pytest.raises(RuntimeError, match="device read failed"):
            w.tiers.flush_write_downs()
    assert w.tiers.flush_write_downs() == 0  # the last try gives them up
    w.tiers.write_downs.check_flushed(mark)
    assert w.tiers.num_write_downs_queued == 0 and w.tiers.write_downs.num_dropped == 2
    assert w.stack.lookup(w.held[2:]) == [None, None]
    w.tiers.close()
