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
`_prefetches`, `_fetching`, `_lost`, `_staging`, `write_downs` and `flush_write_downs`; it looks
at the stack and loads from it through `write_downs` (a block still being stored counts as held,
and its load waits for the store).

Every look below first flushes the write-downs queued since the last flush (`_see_evicted`): a
block the device evicted earlier in the same `schedule()` pass is otherwise in no tier until the
engine's flush after it, so a plan there missed the whole run behind it (the device kept the
blocks before it). Under `--offload-mode deferred` an offloaded session's blocks go down only
at that eviction: a 236K-token call's host run read as none, its SRPT key (kept 8 steps) put it
behind a 6.5K-token one, and the 100-user simulation paid +1.37% mean TTFT over lazy, which had
written them at the hint (docs/benchmarks/history/sim.md, twenty-first session, scale6).

A request whose next blocks a prefetch is bringing up takes that transfer over as its own load
(`adopt`: the prefetch's blocks, staging and future become part of the request's load, no second
copy), and is admitted as LOADING at once with room reserved for the rest; its own plan of the
blocks after them stops at the first block another prefetch is bringing up (`held_up`). A
request's load is a list of parts (`PendingLoad`s, in block order): the adopted slices of
prefetches, then its own. A block whose prefetch failed or timed out is computed, not loaded
again from the same tier, for one load timeout after that poll. (The agent sends its prefetch
hint just before its call: the call's own load of the same blocks took a second copy's room and
bandwidth (the fifteenth session); holding the call in the queue until the prefetch landed left
its room to others and cost the whole trace set 0.0167 s/call of queue (the sixteenth's review).)
"""

from __future__ import annotations

import math
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
    first: int = 0  # a slice of a split prefetch: its first block's index in `batch`'s results
    whole: bool = True  # False: a slice (its time is the whole batch's: not a bandwidth sample)

    def ready(self, now: float) -> bool:
        return now >= self.deadline or self.batch.done()

    def results(self) -> list[bool]:
        """Per block: arrived intact in time (a load still pending counts as failed)."""
        if not self.batch.done():
            return [False] * len(self.hashes)
        got = self.batch.result()
        return got if self.whole else got[self.first:self.first + len(self.hashes)]

    def part(self, lo: int, hi: int) -> PendingLoad:
        """Blocks [lo, hi) of this load, on the same transfer (staging rows are views)."""
        return PendingLoad(self.hashes[lo:hi], self.blocks[lo:hi], self.tiers[lo:hi], self.staging[lo:hi],
                           self.batch, self.started, self.deadline, self.done_at, self.first + lo, False)


class TierLoads:
    """Loads and prefetches (see the module docstring); mixed into `TierConnector`."""

    def _see_evicted(self) -> None:
        """Blocks evicted since the last flush are in the top tier for the look that follows (the
        module doc): the gather the engine would run after `schedule()`, run now, under the state
        lock, when a look below follows; with nothing queued it waits for a flush running on
        another thread (the engine's, outside the state lock). On CUDA a flushed block may still
        be storing: the look sees the stack through `write_downs` (`WriteDowns`: the contract)."""
        self.write_downs.flush()

    def plan(self, hashes: list[BlockHash]) -> list[str]:
        """Tiers of the leading run of `hashes` held below and worth loading (may be empty)."""
        self._see_evicted()
        run = self.write_downs.lookup_run(hashes)
        # worth_loading per tier, not per block: a waiting prompt's thousands-of-blocks host run
        # is re-planned every step it waits (40% of a 100-user simulation, py-spy)
        skip = {t for t in set(run) if not self.costs.worth_loading(t)}
        if skip:
            run = list(takewhile(lambda t: t not in skip, run))
        return run

    def in_flight_run(self, hashes: list[BlockHash]) -> int:
        """How many leading `hashes` pending prefetches are bringing up (`adopt` takes them)."""
        fetching = self._fetching
        if not fetching or hashes[0] not in fetching:  # (the usual case: one lookup)
            return 0
        return sum(1 for _ in takewhile(fetching.__contains__, hashes))

    def in_flight_tiers(self, hashes: list[BlockHash]) -> list[str]:
        """The tier each of `hashes` (all in flight) is being brought up from."""
        return [self._fetching[h] for h in hashes]

    def adopt(self, key: str, hashes: list[BlockHash]) -> list[Block]:
        """Request `key` takes over the prefetches bringing up `hashes` (an `in_flight_run`) as
        the first parts of its load: their slices leave the prefetches (the rest of each stays
        one), and their device blocks, returned in order, become the request's (their
        references pass to it). No second copy and no second wait: it lands when they do."""
        at = {h: (p, i) for p in self._prefetches for i, h in enumerate(p.hashes)}
        taken: dict[int, list[tuple[int, int]]] = {}  # id(prefetch) -> its slices taken
        parts, blocks, i = [], [], 0
        while i < len(hashes):
            p, j = at[hashes[i]]
            m = 1
            while i + m < len(hashes) and j + m < len(p.hashes) and p.hashes[j + m] == hashes[i + m]:
                m += 1
            parts.append(p if m == len(p.hashes) else p.part(j, j + m))  # (whole: its time is a sample)
            blocks += p.blocks[j:j + m]
            taken.setdefault(id(p), []).append((j, j + m))
            i += m
        kept = []
        for p in self._prefetches:
            cuts = sorted(taken.get(id(p), ()))
            if not cuts:
                kept.append(p)
                continue
            lo = 0
            for a, b in cuts + [(len(p.hashes), len(p.hashes))]:
                if a > lo:
                    kept.append(p.part(lo, a))
                lo = b
        self._prefetches = kept
        for h in hashes:
            del self._fetching[h]
        self._loads[key] = parts
        return blocks

    def start_load(self, key: str, hashes: list[BlockHash], blocks: list[Block],
                   tiers: list[str]) -> None:
        """Load `hashes` into `blocks` for request `key`, after any parts it adopted."""
        if hashes:
            self._loads.setdefault(key, []).append(self._load(hashes, blocks, tiers))

    def load_ready(self, key: str) -> bool:
        now = self.clock()
        return all(p.ready(now) for p in self._loads[key])

    def load_tiers(self, key: str) -> list[str]:
        """The tier each block of `key`'s pending load comes from."""
        return [t for p in self._loads[key] for t in p.tiers]

    def next_landing_s(self) -> float:
        """Seconds until the first request's load in flight is expected to have landed (0 once
        overdue; inf with none in flight): each load from its first part's start, all its blocks
        one after another at its slowest tier's estimated load time (`TransferCosts.load_s`; the
        parts it adopted share the link). `srpt-land` ends a long chunk by then."""
        now, left = self.clock(), math.inf
        order = [t.name for t in self.stack.tiers]
        for parts in self._loads.values():
            tiers = {t for p in parts for t in p.tiers}
            if not tiers:
                continue
            per_block = self.costs.load_s(max(tiers, key=order.index))
            start = min(p.started for p in parts)
            left = min(left, max(0.0, start + per_block * sum(len(p.hashes) for p in parts) - now))
        return left

    def wait_load(self, key: str, timeout_s: float) -> bool:
        """Block until `key`'s load has landed or `timeout_s` passes (`Mover.wait_done`: the
        simulator's mover blocks in simulated time). True: it landed (`finish_load` takes it)."""
        t0 = self.clock()
        for p in self._loads[key]:
            left = timeout_s - (self.clock() - t0)
            if not p.batch.done() and left > 0:
                self.stack.mover.wait_done(p.batch, left)
        self.counters.load_wait_s += self.clock() - t0
        return all(p.batch.done() for p in self._loads[key])

    def finish_load(self, key: str) -> tuple[int, list[str]]:
        """Scatter the leading run of good blocks of a ready load into the device (its parts in
        order, up to the first block that did not arrive); returns (blocks loaded, their tiers).
        The caller registers them and advances its sequence."""
        n, hashes, tiers = 0, [], []
        for load in self._loads.pop(key):
            got = self._land(load)
            n += got
            hashes += load.hashes[:got]
            tiers += load.tiers[:got]
            if got < len(load.hashes):
                break  # the rest is computed
        self.counters.num_loaded += n
        self._leave_below(hashes)
        return n, tiers

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
        self._see_evicted()
        return self._prefetch_run(todo, self.write_downs.lookup_run(todo)), len(found) - missing

    def prefetch_counted(self, hashes: list[BlockHash]) -> tuple[int, int, int]:
        """`prefetch`, also returning the blocks of `hashes` held below (as `where` counts them,
        before the prefetch): (scheduled, on device, below), from ONE walk of the session's
        blocks per index (SAM's prefetch hint walked them twice)."""
        lower = list(compress(hashes, map(not_, self.pool.lookup_many(hashes))))  # (C)
        self._see_evicted()
        where = self.write_downs.lookup(lower)
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
        self._fetching.update(zip(todo[:n], tiers[:n]))
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
        prefetch failed or timed out less than one load timeout ago (a request that took that
        prefetch over, or comes after it, computes it rather than wait out a second load
        timeout on a hung tier, whether it is admitted in that step or a later one)."""
        return h in self._fetching or h in self._lost

    def prefetching_blocks(self) -> list[Block]:
        """Device blocks held by pending prefetches (in use, owned by no sequence)."""
        return [b for p in self._prefetches for b in p.blocks]

    def _load(self, hashes: list[BlockHash], blocks: list[Block], tiers: list[str]) -> PendingLoad:
        staging = self._staging(len(hashes))
        now = self.clock()
        load = PendingLoad(hashes, blocks, tiers, staging, self.write_downs.load_many(hashes, staging), now,
                           now + self.costs.load_timeout_s(len(hashes)))

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
        order = [t.name for t in self.stack.tiers]
        if not load.batch.done():
            self.counters.num_load_timeouts += 1
            if load.whole:  # a stall: its tier is held off a while (a tier that always times out, ever longer)
                self.costs.observe_timeout(max(load.tiers, key=order.index), len(load.hashes),
                                           self.clock() - load.started)
        self.counters.num_load_failed += len(results) - n
        if n:
            self.flush_write_downs()  # queued victims are gathered before any device write
            self.io.write([b.block_id for b in load.blocks[:n]], load.staging[:n])
            slowest = max(load.tiers[:n], key=order.index)
            if load.done_at is not None and load.whole:
                seconds = load.done_at - load.started
                self.costs.observe_load(slowest, n, seconds)
                self.counters.loaded_bytes += n * self.layout.nbytes
                self.counters.load_s += seconds
        return n

    def _land_prefetches(self, now: float) -> None:
        """Land the ready prefetches: their good blocks registered as cached (ref 0) when some
        live session still holds them and the device lacks them; the others released empty."""
        still, lost = [], self._lost
        for h in [h for h, until in lost.items() if until <= now]:
            del lost[h]
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
            for h in p.hashes:
                self._fetching.pop(h, None)
            until = now + self.costs.load_timeout_s(len(p.hashes) - n)
            lost.update((h, until) for h in p.hashes[n:])
        self._prefetches = still

    def pending_futures(self) -> list[Future]:
        loads = [p for parts in self._loads.values() for p in parts]
        pending = {id(p.batch): p.batch for p in [*loads, *self._prefetches] if not p.batch.done()}
        return list(pending.values())  # (a split prefetch's parts share one future)

    def wait_for_loads(self, futures: list[Future[bool]], timeout_s: float) -> None:
        """Idle engine: block (outside the state lock) until `futures` land or `timeout_s` passes
        (waking per future would make the engine thread fight the movers for the GIL)."""
        if futures:
            t0 = time.perf_counter()
            wait(futures, timeout=timeout_s, return_when=ALL_COMPLETED)
            self.counters.load_wait_s += time.perf_counter() - t0
