"""The tier connector's way up: loads of a waiting request's prefix and prefetches, from the
tier stack into the device (`TierLoads`, a mixin of `cache.tier_connector.TierConnector`).

    plan(hashes)  ->  start_load / prefetch  ->  (mover threads fill staging)  ->  finish_load / poll
    leading run      device blocks taken now    `TierStack.load_many`: one          the leading run of
    worth loading    (a prefetch: only room     future per load                     good blocks is
    (`tier_costs`)   ranked below running)                                          scattered in

A load only ever fills a staging buffer it owns, so a late or abandoned one cannot touch the
device cache; the device write happens on the engine thread, after queued write-downs are
flushed (`_land`). The mixin uses the connector's `pool`, `stack`, `io`, `costs`, `counters`,
`clock`, `layout`, `host_mode`, `pool_tier`, `spm`, `protected_class`, `keep`, `_loads`,
`_prefetches`, `_fetching`, `_lost`, `_staging` and `flush_write_downs`.

A request's own load never takes a block a prefetch is bringing up (`held_up`): when its next
block is in flight it waits for that prefetch to land (`KVCacheManager.match_lower`), then matches
those blocks on the device; a plan stops at the first in-flight block (past its loaded run it
computes: its next block was evicted after the prefetch was planned). A block whose prefetch
failed or timed out is computed, not loaded again from the same tier. (The agent sends its prefetch hint just before its call: the call's own load of the same
blocks took a second copy's room and bandwidth, and its room came out of queued requests'
prefixes: `hintkv sim`, sixteenth session.)
"""

from __future__ import annotations

import time
import weakref
from concurrent.futures import ALL_COMPLETED, Future, wait
from dataclasses import dataclass
from itertools import compress, takewhile
from operator import not_

import torch

from hintkv.cache.block import Block
from hintkv.cache.hashing import BlockHash


@dataclass(slots=True, weakref_slot=True)
class PendingLoad:
    """Blocks being read from the stack into `staging`, to be scattered into `blocks`."""

    hashes: list[BlockHash]
    blocks: list[Block]  # device blocks (ref_cnt held by us or by a sequence), same order
    tiers: list[str]  # the tier each block was found in when planned
    staging: torch.Tensor  # [n, *layout.shape], ours alone
    batch: Future[list[bool]]  # all its blocks (`TierStack.load_many`: one mover submission)
    started: float
    deadline: float
    done_at: float | None = None  # when the last block arrived (for bandwidth)

    def ready(self, now: float) -> bool:
        return now >= self.deadline or self.batch.done()

    def results(self) -> list[bool]:
        """Per block: arrived intact in time (a load still pending counts as failed)."""
        return self.batch.result() if self.batch.done() else [False] * len(self.hashes)


class TierLoads:
    """Loads and prefetches (see the module docstring); mixed into `TierConnector`."""

    def plan(self, hashes: list[BlockHash]) -> list[str]:
        """Tiers of the leading run of `hashes` held below and worth loading (may be empty)."""
        run = self.stack.lookup_run(hashes)
        # worth_loading per tier, not per block: a waiting prompt's thousands-of-blocks host run
        # is re-planned every step it waits (40% of a 100-user simulation, py-spy)
        skip = {t for t in set(run) if not self.costs.worth_loading(t)}
        if skip:
            run = list(takewhile(lambda t: t not in skip, run))
        return run

    def start_load(self, key: str, hashes: list[BlockHash], blocks: list[Block],
                   tiers: list[str]) -> None:
        self._loads[key] = self._load(hashes, blocks, tiers)

    def load_ready(self, key: str) -> bool:
        return self._loads[key].ready(self.clock())

    def load_tiers(self, key: str) -> list[str]:
        """The tier each block of `key`'s pending load comes from."""
        return self._loads[key].tiers

    def wait_load(self, key: str, timeout_s: float) -> bool:
        """Block until `key`'s load has landed or `timeout_s` passes (`Mover.wait_done`: the
        simulator's mover blocks in simulated time). True: it landed (`finish_load` takes it)."""
        batch = self._loads[key].batch
        if not batch.done() and timeout_s > 0:
            t0 = self.clock()
            self.stack.mover.wait_done(batch, timeout_s)
            self.counters.load_wait_s += self.clock() - t0
        return batch.done()

    def finish_load(self, key: str) -> tuple[int, list[str]]:
        """Scatter the leading run of good blocks of a ready load into the device; returns
        (blocks loaded, their tiers). The caller registers them and advances its sequence."""
        load = self._loads.pop(key)
        n = self._land(load)
        self.counters.num_loaded += n
        self._leave_below(load.hashes[:n])
        return n, load.tiers[:n]

    def _leave_below(self, hashes: list[BlockHash]) -> None:
        """`exclusive`: blocks now on the device leave the private tiers below (host, disk)."""
        if self.host_mode != "exclusive" or not hashes:
            return
        for t in self.stack.tiers:
            if t is not self.pool_tier:
                t.remove_many(hashes)

    def cancel_load(self, key: str) -> None:
        """The sequence left (abort, finish): forget its load; stray I/O only fills staging."""
        self._loads.pop(key, None)

    def prefetch(self, hashes: list[BlockHash], cls: int | None = None) -> tuple[int, int]:
        """Load the leading held-below run of `hashes` (after blocks already on the device)
        into device blocks taken only from KV ranked below running sessions, below the lowest
        class of its own cached head, or, with none of it cached, below `cls` (the waiting
        session's own class: a session that lost all its blocks never evicts one ranked above
        it). Returns (blocks scheduled, blocks already on the device)."""
        found = self.pool.lookup_many(hashes)
        missing = found.count(None)
        if not missing:  # all on the device (a predicted resume's usual case): nothing to load
            return 0, len(found)
        lower = list(compress(hashes, map(not_, found)))  # (C)
        in_flight = self._fetching
        todo = [h for h in lower if h not in in_flight] if in_flight else lower
        # the session is WAITING (class below protected): its own cached head must not be
        # a victim of loading its tail, so the room is only what ranks below its head (with no
        # head cached, below its own class `cls`: never a waiting session ranked above it)
        own = [self.pool.class_of(b) for b in found if b is not None and b.ref_cnt == 0]
        if not self.pool.ranking.grouped:  # `lru`: every session's class is UNHELD, no cap of its own
            cls = None
        room = self.room_below_protected(min(own, default=cls))
        todo = todo[:room]
        return self._prefetch_run(todo, self.stack.lookup_run(todo)), len(found) - missing

    def prefetch_counted(self, hashes: list[BlockHash]) -> tuple[int, int, int]:
        """`prefetch`, also returning the blocks of `hashes` held below (as `where` counts them,
        before the prefetch): (scheduled, on device, below), from ONE walk of the session's
        blocks per index (SAM's prefetch hint walked them twice)."""
        lower = list(compress(hashes, map(not_, self.pool.lookup_many(hashes))))  # (C)
        where = self.stack.lookup(lower)
        below = len(lower) - where.count(None)
        in_flight = self._fetching
        pairs = [(h, w) for h, w in zip(lower, where) if h not in in_flight] if in_flight \
            else list(zip(lower, where))
        room = self.room_below_protected()
        todo = [h for h, _ in pairs[:room]]
        tiers = list(takewhile(bool, (w for _, w in pairs[:room])))
        return self._prefetch_run(todo, tiers), len(hashes) - len(lower), below

    def _prefetch_run(self, todo: list[BlockHash], tiers: list[str]) -> int:
        """Start loading the first len(tiers) blocks of `todo` (held in `tiers`) as a prefetch."""
        n = len(tiers)
        if n == 0:
            return 0
        blocks = self.pool.allocate(n)  # victims (ranked below running) are written down first
        self._prefetches.append(self._load(todo[:n], blocks, tiers[:n]))
        self._fetching.update(todo[:n])
        return n

    def room_below_protected(self, cls: int | None = None) -> int:
        """Free blocks a prefetch may take: empty ones, and cached ones of classes below the
        policy's protected class, and below `cls` if given (the lowest class of the blocks the
        prefetch keeps: a predicted prefetch never evicts its own session's head). O(classes);
        under `lru` nothing is protected."""
        empty = self.pool.num_free - self.pool.num_cached_free
        limit = self.protected_class if cls is None else min(cls, self.protected_class)
        return empty + self.pool.num_cached_below(limit)

    def prefetching(self, h: BlockHash) -> bool:
        """A pending prefetch is bringing `h` up: a request that needs it next waits for it."""
        return h in self._fetching

    def held_up(self, h: BlockHash) -> bool:
        """A request's own load does not take `h`: a pending prefetch is bringing it up, or its
        prefetch failed or timed out in this step's `poll` (a request that waited for it on a
        hung tier computes it rather than wait out a second load timeout there)."""
        return h in self._fetching or h in self._lost

    def prefetching_blocks(self) -> list[Block]:
        """Device blocks held by pending prefetches (in use, owned by no sequence)."""
        return [b for p in self._prefetches for b in p.blocks]

    def _load(self, hashes: list[BlockHash], blocks: list[Block], tiers: list[str]) -> PendingLoad:
        staging = self._staging(len(hashes))
        now = self.clock()
        load = PendingLoad(hashes, blocks, tiers, staging, self.stack.load_many(hashes, staging),
                           now, now + self.costs.load_timeout_s(len(hashes)))

        # a weak reference: the load holds its future and the future its callbacks, so a strong
        # one is a cycle that only the cyclic collector frees (staging tensor included)
        ref = weakref.ref(load)

        def arrived(_: Future) -> None:
            if (pending := ref()) is not None:
                pending.done_at = self.clock()
        load.batch.add_done_callback(arrived)
        return load

    def _land(self, load: PendingLoad) -> int:
        """Scatter the leading run of good blocks into the device; count and learn from it."""
        results = load.results()
        n = next((i for i, ok in enumerate(results) if not ok), len(results))
        if not load.batch.done():
            self.counters.num_load_timeouts += 1
        self.counters.num_load_failed += len(results) - n
        if n:
            self.flush_write_downs()  # queued victims are gathered before any device write
            self.io.write([b.block_id for b in load.blocks[:n]], load.staging[:n])
            order = [t.name for t in self.stack.tiers]
            slowest = max(load.tiers[:n], key=order.index)
            if load.done_at is not None:
                seconds = load.done_at - load.started
                self.costs.observe_load(slowest, n, seconds)
                self.counters.loaded_bytes += n * self.layout.nbytes
                self.counters.load_s += seconds
        return n

    def _land_prefetches(self, now: float) -> None:
        """Land the ready prefetches: their good blocks registered as cached (ref 0) when some
        live session still holds them and the device lacks them; the others released empty."""
        still, lost = [], set()
        for p in self._prefetches:
            if not p.ready(now):
                still.append(p)
                continue
            n = self._land(p)
            for i, (h, b) in enumerate(zip(p.hashes, p.blocks)):
                if i < n and self.keep(h) and self.pool.lookup(h) is None:
                    self.pool.register(b, h)
                    self.counters.num_prefetched += 1
                    self._leave_below([h])
                    if self.spm is not None and p.tiers[i] == self.spm.pool.name:
                        self.spm.counters.num_pool_prefetched += 1
            self.pool.release(p.blocks)  # registered: cached (ref 0); the others: empty
            self._fetching.difference_update(p.hashes)
            lost.update(p.hashes[n:])
        self._prefetches, self._lost = still, lost

    def pending_futures(self) -> list[Future]:
        return [p.batch for p in [*self._loads.values(), *self._prefetches] if not p.batch.done()]

    def wait_for_loads(self, futures: list[Future[bool]], timeout_s: float) -> None:
        """Idle engine: block (outside the state lock) until `futures` land or `timeout_s` passes
        (waking per future would make the engine thread fight the movers for the GIL)."""
        if futures:
            t0 = time.perf_counter()
            wait(futures, timeout=timeout_s, return_when=ALL_COMPLETED)
            self.counters.load_wait_s += time.perf_counter() - t0
