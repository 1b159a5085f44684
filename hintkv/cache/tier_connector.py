"""The scheduler-side tier connector: the device pool's only link to the tiers below (host, disk).

What it decides and starts, all on the engine thread under its state lock:

  down  `on_device_evict(victims)` (the pool's hook): victims some live session holds (every
        block when hints are off) are QUEUED (`cache.write_downs`, which states the flush
        contract); `flush_write_downs()` gathers the ones the stack lacks and stores them. The
        engine calls it after scheduling and before the forward pass (which may overwrite the
        reused blocks), so `allocate` under the state lock never copies; any device write of
        ours (landing a load) flushes first, and so does any look below that follows evictions
        (`plan`, a prefetch's: a block evicted in this pass is in the top tier for it,
        `cache.tier_loads`). `offload(hashes)` writes a session's device blocks down now
        (`offload_mode`: lazy, eager; deferred, the default, writes nothing then); `poll()` drops
        their device copies once they landed (eager).
  up    `plan(hashes)`: the leading run of device-missing hashes the stack holds and that are
        cheaper to load than to recompute (`tier_costs`). `start_load(key, hashes, blocks)` reads
        them into staging; `finish_load(key)` scatters the leading run of good blocks into the
        device and reports it (a failed or timed-out block truncates there: the rest recomputes).
        `prefetch(hashes)` loads blocks into device room that only holds KV ranked below running
        sessions; `poll()` registers them as cached (ref 0) when they land. (`cache.tier_loads`)
  ranks `poll()` also publishes the step's block-class changes (`cache.ranking`) on the tiers'
        `RankBoard`: each tier evicts by those classes (one class under `lru`: plain LRU), and
        tier / mover threads read only the board, never the session registry.

When to prefetch a waiting session is SAM's decision (`cache.sam`); `/metrics` text is the
server's (`server.metrics`); this module reports numbers (`stats`). The stack's I/O runs on the
mover's threads and only ever fills staging buffers this class owns, so a late or abandoned load
cannot touch the device cache.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, not_

import torch

from hintkv.cache.block import Block
from hintkv.cache.block_pool import BlockPool
from hintkv.cache.hashing import BlockHash
from hintkv.cache.ranking import ClassRanking
from hintkv.cache.spm import SessionPoolManager
from hintkv.cache.tier_costs import TransferCosts
from hintkv.cache.tier_loads import PendingLoad, TierLoads
from hintkv.cache.types import DEFAULT_OFFLOAD_MODE, HOST_MODES, OFFLOAD_MODES
from hintkv.cache.write_downs import WriteDowns
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.mover import resolved
from hintkv.tiers.pool import PoolTier
from hintkv.tiers.ranks import RankBoard
from hintkv.tiers.stack import TierStack

log = logging.getLogger(__name__)
_id_of = attrgetter("block_id")

@dataclass(slots=True)
class PendingOffload:
    """An offload's blocks (the session's chain, head first) and a future per block (`eager`
    only: the other modes drop nothing and keep both empty). `left` counts its distinct
    futures not done yet: each one's done-callback counts down, and the last queues the
    offload for `poll` (no per-step walk over every future)."""

    seq: int  # offload order: `poll` handles the landed ones in it
    hashes: list[BlockHash]
    futures: list[Future[bool]]
    left: int = 0


@dataclass(slots=True)
class TierCounters:
    num_offload_dropped: int = 0  # device copies dropped after an offload landed
    num_loaded: int = 0  # blocks scattered into the device from the stack (requests)
    num_prefetched: int = 0  # blocks loaded ahead of a request and registered as cached
    num_load_failed: int = 0  # blocks whose load missed (corrupt, I/O error, gone): recomputed
    num_load_timeouts: int = 0  # loads abandoned as slower than recomputing
    num_predicted_prefetches: int = 0  # sessions prefetched on a predicted resume (by SAM)
    load_wait_s: float = 0.0  # engine seconds spent idle waiting for loads
    loaded_bytes: int = 0  # payload bytes of landed loads (requests and prefetches)
    load_s: float = 0.0  # their durations, start to last block read (for bandwidth)




class TierConnector(TierLoads):
    """The link down (write-downs, offloads), up (loads, prefetches: `TierLoads`) and ranks."""

    def __init__(self, pool: BlockPool, block_size: int, stack: TierStack, io: DeviceBlockIO,
                 ranking: ClassRanking, hints: bool, clock: Callable[[], float] = time.monotonic,
                 offload_mode: str = DEFAULT_OFFLOAD_MODE, host_mode: str = "inclusive") -> None:
        if offload_mode not in OFFLOAD_MODES:
            raise ValueError(f"offload_mode must be one of {OFFLOAD_MODES}, got {offload_mode!r}")
        if host_mode not in HOST_MODES:
            raise ValueError(f"host_mode must be one of {HOST_MODES}, got {host_mode!r}")
        self.offload_mode = offload_mode
        self.host_mode = host_mode
        self.pool = pool
        self.clock = clock  # injectable: the simulator runs the connector in simulated time
        self.block_size = block_size
        self.stack = stack
        self.io = io
        self.ranking = ranking
        self.hints = hints
        self.protected_class = ranking.policy.protected_class
        self.layout = stack.layout
        self.costs = TransferCosts(self.layout.nbytes, block_size, clock=clock)
        for tier in stack.tiers:  # each tier's own nominal read bandwidth, where it reports one
            if tier.read_bps is not None:
                self.costs.seed(tier.name, tier.read_bps)
        self.counters = TierCounters()
        self._loads: dict[str, list[PendingLoad]] = {}  # request id -> its prefix load's parts
        self._prefetches: list[PendingLoad] = []
        self._fetching: dict[BlockHash, str] = {}  # the hashes of `_prefetches` -> their tier
        # hashes landed prefetches did not bring up -> until when a request's load skips them
        self._lost: dict[BlockHash, float] = {}
        # offloads: counted until `poll` consumed them; the landed ones queued by done-callbacks
        # (mover threads) under `_landed_lock`
        self._num_offloads = 0
        self._offload_seq = 0
        self._landed: list[PendingOffload] = []
        self._landed_lock = threading.Lock()
        # a host buffer of n blocks for one transfer (a function of the mover, not of this connector: no cycle)
        self._staging = _stager(stack.mover, self.layout)
        # evicted blocks not yet gathered: flushed before the device reuses the blocks
        self.write_downs = WriteDowns(stack, io, self._staging)
        # what tier threads read, once per step
        self.board = RankBoard(ranking.full_delta(), grouped=ranking.grouped)
        pool.on_evict = self.on_device_evict
        stack.set_keep(self._keep_below)
        for tier in stack.tiers:
            tier.set_ranks(self.board)
        self.pool_tier = pool_tier = next((t for t in stack.tiers if isinstance(t, PoolTier)),
                                          None)
        self.spm = (SessionPoolManager(pool_tier, pool, io, ranking.held,
                                       self._staging)
                    if pool_tier is not None and hints else None)  # session semantics (SPM)

    # ---- ranks ---------------------------------------------------------------------------
    def keep(self, h: BlockHash) -> bool:
        """Worth a write to a slower tier: held by a live session (hints off: any cached block).
        Engine thread only (reads the live ranking)."""
        return self.ranking.is_held(h) if self.hints else True

    def _keep_below(self, h: BlockHash) -> bool:
        """The stack's cascade test, run on tier threads: reads the published board only."""
        return self.board.held(h) if self.hints else True

    def publish(self) -> None:
        """Hand the tiers this step's block-class changes (a frozen delta)."""
        self.board.publish(self.ranking.take_delta())

    # ---- down ----------------------------------------------------------------------------
    def on_device_evict(self, victims: list[Block]) -> None:
        """Pool hook: `victims` are about to be reused. Queue the kept ones; no copy here."""
        if self.hints:  # `keep` of each, against the live ranking's held set at once
            held = self.ranking.held()
            kept = [(h, b.block_id) for b in victims if (h := b.hash) is not None and h in held]
        else:
            kept = [(h, b.block_id) for b in victims if (h := b.hash) is not None]
        if kept:
            self.write_downs.queue(kept)

    def flush_write_downs(self) -> int:
        """Gather the queued victims the stack lacks and store them (`WriteDowns.flush`: the
        contract). Must run before anything writes the reused device blocks. Returns the blocks
        written."""
        return self.write_downs.flush()

    @property
    def num_write_downs_queued(self) -> int:
        return self.write_downs.num_pending

    def offload(self, hashes: list[BlockHash]) -> tuple[int, int]:
        """Write the device-resident blocks among `hashes` down now; their device copies are
        dropped by `poll` once stored. Returns (blocks written, blocks already below).
        `deferred`: nothing is written now (evicting them later writes them down)."""
        written, below, _ = self.offload_counted(hashes)
        return written, below

    def offload_counted(self, hashes: list[BlockHash], write_now: bool = False) -> tuple[int, int, int]:
        """`offload`, also returning the blocks of `hashes` on the device: (written, already
        below, on device), from ONE walk of the session's blocks (SAM's offload hint walked them
        twice: 28% of a full-scale hinted simulation, py-spy). `write_now`: deferred mode writes
        them now, as lazy does (a range offload: deferred's demotion is the whole session's)."""
        # C-level passes (`compress`, `map`): a full-scale session holds thousands of blocks
        found = self.pool.lookup_many(hashes)
        on_device = list(compress(hashes, found))  # (a Block is always truthy)
        where = self.stack.lookup(on_device)
        n = len(on_device)
        if self.offload_mode == "deferred" and not write_now:
            return 0, n - where.count(None), n
        missing = list(map(not_, where))  # not below yet (tier names are non-empty)
        fresh = list(compress(on_device, missing))
        ids = list(map(_id_of, compress(filter(None, found), missing)))
        batch = self.write_downs.write_now(fresh, ids) if fresh else []
        self._offload_seq += 1
        self._num_offloads += 1
        if self.offload_mode == "eager":  # `poll` drops from the tail: a future per block
            written = iter(batch)
            below = resolved(True)  # one finished future for every block already below (a Future
            #                         each was 60% of a full-scale simulation's wall time: py-spy)
            futures = [next(written) if w is None else below for w in where]
            o = PendingOffload(self._offload_seq, on_device, futures)
        else:  # lazy: the device copies stay; only the landing is counted (`idle`)
            o = PendingOffload(self._offload_seq, [], [])
        # distinct futures (a write-down batch shares one; blocks below need none)
        pending = [f for f in {id(f): f for f in batch}.values() if not f.done()]
        if not pending:
            with self._landed_lock:
                self._landed.append(o)
            return len(fresh), n - len(fresh), n
        o.left = len(pending)  # before any callback can count down

        def landed(_: Future, o: PendingOffload = o) -> None:
            with self._landed_lock:
                o.left -= 1
                if o.left == 0:
                    self._landed.append(o)
        for f in pending:
            f.add_done_callback(landed)
        return len(fresh), n - len(fresh), n

    def publish_to_pool(self, hashes: list[BlockHash]) -> int:
        """A request finished: write its blocks through to the shared pool (if any)."""
        return self.spm.publish(hashes) if self.spm is not None else 0

    def remove_below(self, hashes: list[BlockHash]) -> dict[str, int]:
        """Forget blocks nobody holds from every lower tier; blocks removed per tier."""
        return {t.name: t.remove_many(hashes) for t in self.stack.tiers}

    # ---- housekeeping, once per engine step ------------------------------------------------
    def poll(self) -> None:
        """Once per engine step: publish class changes to the tiers, land finished prefetches
        (as cached blocks), drop offloaded device copies."""
        self.publish()
        now = self.clock()
        self._land_prefetches(now)
        with self._landed_lock:
            landed, self._landed = self._landed, []
        self._num_offloads -= len(landed)
        if self.offload_mode == "eager":  # lazy: written down, the device copy stays, free to evict
            for o in sorted(landed, key=lambda o: o.seq):
                self._drop_offloaded(o)
        if self.spm is not None:
            self.spm.tick(now)

    def _drop_offloaded(self, o: PendingOffload) -> None:
        """Eager offload: drop the device copies from the tail of the chain while each is
        stored below, held by no other session (a shared prefix stays where its other holders
        match it), ranked below the protected class and not in use. The first block that must
        stay ends the drop: a head dropped under a device tail would cut the chain a resume
        matches (the replay's rule too)."""
        for h, f in zip(reversed(o.hashes), reversed(o.futures)):
            b = self.pool.lookup(h)
            if b is None:
                continue  # gone already (evicted, written below)
            if not f.result() or self.ranking.num_holders(h) > 1 \
                    or self.ranking.block_class(h) >= self.protected_class or not self.pool.drop(b):
                return
            self.counters.num_offload_dropped += 1

    def idle(self) -> bool:
        return not (self._loads or self._prefetches or self._num_offloads or self.write_downs.busy())

    # ---- reporting -----------------------------------------------------------------------
    def where(self, hashes: list[BlockHash]) -> dict[str, int]:
        """Blocks of `hashes` per tier (device first; a block counts in its highest tier)."""
        out = {"device": 0, **{t.name: 0 for t in self.stack.tiers}}
        lower = [h for h, b in zip(hashes, self.pool.lookup_many(hashes)) if b is None]
        out["device"] = len(hashes) - len(lower)
        for t in self.write_downs.lookup(lower):  # (a block still storing: in the top tier)
            if t is not None:
                out[t] += 1
        return out

    def stats(self) -> dict:
        s = self.stack.stats()
        c = self.counters
        return {
            "tiers": {name: {"num_blocks": u.num_blocks, "capacity_blocks": u.capacity_blocks,
                             "bytes_used": u.bytes_used, **_tier_counts(s.tiers[name])}
                      for name, u in self.stack.usage().items()},
            "bytes_moved": dict(s.transfers.bytes_moved),
            "blocks_moved": dict(s.transfers.blocks_moved),
            "load_wait_s": c.load_wait_s + s.transfers.load_wait_s,
            "loaded_bytes": c.loaded_bytes,
            "load_s": c.load_s,
            "num_written_down": self.write_downs.num_written,
            "num_offload_dropped": c.num_offload_dropped,
            "num_loaded": c.num_loaded,
            "num_prefetched": c.num_prefetched,
            "num_predicted_prefetches": c.num_predicted_prefetches,
            "num_load_failed": c.num_load_failed,
            "num_load_timeouts": c.num_load_timeouts,
            "num_corrupt": sum(t.num_corrupt for t in s.tiers.values()),
            "num_io_errors": sum(t.num_io_errors for t in s.tiers.values()),
            "num_cascaded": s.num_cascaded,
            "num_dropped": s.num_dropped,
            "costs": self.costs.snapshot(),
            **({"pool": self.spm.stats()} if self.spm is not None else
               {"pool": self.pool_tier.pool_stats()} if self.pool_tier is not None else {}),
        }

    def check_integrity(self) -> None:
        self.stack.check_integrity()
        for p in [*(p for parts in self._loads.values() for p in parts), *self._prefetches]:
            assert all(b.ref_cnt > 0 and b.hash is None for b in p.blocks), \
                "a block being loaded is free or already indexed"

    def wait_write_downs(self) -> None:
        self.write_downs.wait()

    def close(self) -> None:
        """Finish the write-downs, close the stack, and unplug what `__init__` plugged into the device pool, the
        stack and the tiers: each pointed back here, a reference cycle that kept the device KV cache and the
        tiers' memory of a dropped engine until the collector's next full collection."""
        self.flush_write_downs()
        self.wait_write_downs()
        self.stack.close()
        self.pool.on_evict = None
        self.stack.set_keep(None)
        for tier in self.stack.tiers:
            tier.set_ranks(None)


def _stager(mover, layout) -> Callable[[int], torch.Tensor]:
    return lambda n: mover.staging((n, *layout.shape), layout.dtype)


def _tier_counts(t) -> dict[str, int]:
    return {"puts": t.num_puts, "put_failed": t.num_put_failed, "hits": t.num_hits,
            "misses": t.num_misses, "corrupt": t.num_corrupt, "io_errors": t.num_io_errors,
            "evicted": t.num_evicted, "removed": t.num_removed}
