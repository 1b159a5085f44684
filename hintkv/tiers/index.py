"""Bookkeeping shared by the tiers that hold blocks in storage of their own (host, disk).

`IndexedTier` keeps key -> `Entry`, a logical access clock, the victim order, the eviction
listener and the event counters (the futures it hands out and the per-storage ordering of its
I/O: `index_io.TierIO`). Victim order follows the
engine's `RankBoard`: one bucket per eviction class; inside it one node per group of blocks
(the blocks the same sessions hold: usually one session's context), least recently used node
first, least recently used entry first inside a node. A put on a full tier pops victims instead
of scanning, and a session changing class moves ONE node (O(1)), not its blocks. Subclasses own the
storage itself (a buffer slot, a file) through three hooks (`_write`, `_read`, `_drop`; with
`batched_put`, `_write_many`: a batch in one transfer) and `check_integrity`.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import abstractmethod
from collections.abc import Hashable
from concurrent.futures import Future

import torch

from hintkv.tiers.base import OnEvict, Tier, TierStats, TierUsage, Wants
from hintkv.tiers.index_io import Entry, TierIO
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.mover import Mover, resolved
from hintkv.tiers.order import ClassedLRU
from hintkv.tiers.ranks import UNHELD_GROUP, Delta, RankBoard

log = logging.getLogger(__name__)


class IndexedTier(TierIO, Tier):
    """Index, access clock, victim choice and counters; storage is the subclass's business."""

    def __init__(self, layout: BlockLayout, capacity_blocks: int, mover: Mover | None,
                 ranks: RankBoard | None = None, on_evict: OnEvict | None = None) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity must be >= 0")
        self.layout = layout
        self.capacity_blocks = capacity_blocks
        self.block_nbytes = layout.nbytes  # storage one block takes (disk adds its header)
        self._own_mover = mover is None
        self.mover = mover if mover is not None else Mover(num_workers=2)
        self.upper = "device"  # the tier blocks come from: names the transfer directions
        self._lock = threading.RLock()  # reentrant: listeners may probe the tier
        self._entries: dict[bytes, Entry] = {}
        self._clock = 0
        self._ranks: RankBoard | None = None
        self._order: ClassedLRU[bytes, None] = ClassedLRU()  # class -> group node -> keys
        self._on_evict = on_evict
        self._wants: Wants | None = None  # keys whose evicted bytes the listener keeps
        self._stats = TierStats()
        self._last_op: dict[Hashable, Future] = {}  # storage unit -> its latest I/O
        if ranks is not None:
            self.set_ranks(ranks)

    # -- the contract, over the storage hooks below -----------------------------------------

    def put(self, items: list[tuple[bytes, torch.Tensor]]) -> list[Future[bool]]:
        for key, src in items:
            self._check_put(key, src)
        with self._lock:
            for key, _ in items:  # a re-put refreshes recency first, so it is not a victim below
                entry = self._entries.get(key)
                if entry is not None:
                    self._touch(key, entry)
            fit = self._make_room(len({k for k, _ in items if k not in self._entries}))
            if self.batched_put and fit > 1:
                return self._put_batch(items, fit)
            futures: list[Future[bool]] = []
            for key, src in items:
                entry = self._entries.get(key)
                if entry is not None:  # already held or being written: no-op success
                    futures.append(entry.write)
                elif fit == 0:
                    self._stats.num_put_failed += 1
                    futures.append(resolved(False))
                else:
                    fit -= 1
                    unit, slot, raw = self._write(key, src)
                    entry = Entry(slot, self._tick(), raw)
                    self._add_entry(key, entry)
                    futures.append(self._finish_put(unit, key, entry, raw))
            return futures

    batched_put = False  # the subclass writes many blocks in one transfer (`_write_many`)

    def _put_batch(self, items: list[tuple[bytes, torch.Tensor]], fit: int) -> list[Future[bool]]:
        """`put` as ONE transfer and ONE future for the `fit` first new blocks (a write-down
        batch), instead of a mover submission and futures per block. Lock held."""
        futures: list[Future[bool] | None] = []
        keys: list[bytes] = []
        srcs: list[torch.Tensor] = []
        seen: set[bytes] = set()
        for key, src in items:
            entry = self._entries.get(key)
            if entry is not None:  # already held or being written: no-op success
                futures.append(entry.write)
            elif key in seen:  # twice in this batch: the batch's future
                futures.append(None)
            elif len(keys) == fit:
                self._stats.num_put_failed += 1
                futures.append(resolved(False))
            else:
                keys.append(key)
                seen.add(key)
                srcs.append(src)
                futures.append(None)
        units, raw = self._write_many(keys, srcs)
        out: Future[bool] = Future()
        entries = []
        for key, unit in zip(keys, units):
            entry = Entry(unit, self._tick(), out)
            self._add_entry(key, entry)
            entries.append(entry)
        self._finish_put_many(units, keys, entries, raw, out)
        return [out if f is None else f for f in futures]

    def get(self, key: bytes, dst: torch.Tensor) -> Future[bool]:
        self.layout.check_payload(dst)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._stats.num_misses += 1
                return resolved(False)
            self._touch(key, entry)
            if not entry.ready:
                return self._when_written(entry, lambda: self.get(key, dst))
            unit, raw = self._read(key, entry, dst)
            return self._finish_get(unit, raw)

    def remove(self, key: bytes) -> bool:
        with self._lock:
            if key not in self._entries:
                return False
            self._stats.num_removed += 1
            self._drop(key, evicted=False)
            return True

    def remove_many(self, keys: list[bytes]) -> int:
        """`remove` for many keys under ONE lock acquisition; how many were removed."""
        with self._lock:
            entries = self._entries
            n = 0
            for k in keys:
                if k in entries:  # a key listed twice is removed once
                    self._stats.num_removed += 1
                    self._drop(k, evicted=False)
                    n += 1
            return n

    def usage(self) -> TierUsage:
        with self._lock:
            n = len(self._entries)
            return TierUsage(n, self.capacity_blocks, n * self.block_nbytes)

    # -- storage hooks (called with the lock held) ------------------------------------------

    def _check_put(self, key: bytes, src: torch.Tensor) -> None:
        """Raise ValueError for an item this tier can never store."""
        self.layout.check_payload(src)

    @abstractmethod
    def _write(self, key: bytes, src: torch.Tensor) -> tuple[Hashable, int, Future[bool]]:
        """Claim storage for a new block and start writing it: (storage unit, slot, future)."""

    def _write_many(self, keys: list[bytes], srcs: list[torch.Tensor]
                    ) -> tuple[list[int], Future[bool]]:
        """Claim storage for new blocks and start writing them in one transfer (`batched_put`
        tiers): (storage unit of each, one future for all)."""
        raise NotImplementedError

    @abstractmethod
    def _read(self, key: bytes, entry: Entry, dst: torch.Tensor) -> tuple[Hashable, Future[bool]]:
        """Start reading a ready block into `dst`: (storage unit, future)."""

    @abstractmethod
    def _drop(self, key: bytes, evicted: bool) -> None:
        """Forget `key` and release its storage; tell the listener if evicted."""

    # -- bookkeeping -------------------------------------------------------------------------

    def contains(self, key: bytes) -> bool:
        with self._lock:
            return key in self._entries

    def contains_many(self, keys: list[bytes]) -> list[bool]:
        """`contains` for many keys under ONE lock acquisition (not one per key)."""
        with self._lock:
            return list(map(self._entries.__contains__, keys))  # (C: a run is thousands)

    def last_access(self, key: bytes) -> int:
        with self._lock:
            e = self._entries.get(key)
            return e.last_access if e is not None else -1

    def set_ranks(self, ranks: RankBoard | None) -> None:
        with self._lock:
            self._ranks = ranks
            for key in list(self._entries):
                self._refile(key, self._entries[key])
        if ranks is not None:
            ranks.subscribe(self._reclassify)

    def _reclassify(self, delta: Delta) -> None:
        """Board listener: regrouped entries move one by one (O(blocks that changed group));
        a group whose class changed moves as one node (O(1)). As in the device pool, a block
        joining a held group goes to its FRONT (the delta lists a session's blocks head first,
        so the group ends up tail first, and its new tail goes before the blocks it held)."""
        with self._lock:
            if self._ranks is None:
                return
            for key in delta.blocks:
                entry = self._entries.get(key)
                if entry is not None:
                    self._refile(key, entry, regrouped=True)
            if self._ranks.grouped:
                for group in delta.groups:
                    if self._order.node_class(group) is not None:
                        self._order.move_node(group, self._ranks.group_class(group))

    def set_on_evict(self, on_evict: OnEvict | None, wants: Wants | None = None) -> None:
        with self._lock:
            self._on_evict = on_evict
            self._wants = wants

    def stats(self) -> TierStats:
        with self._lock:
            s = self._stats
            return TierStats(s.num_puts, s.num_put_failed, s.num_hits, s.num_misses,
                             s.num_corrupt, s.num_io_errors, s.num_evicted, s.num_removed)

    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self._entries)

    def flush(self) -> None:
        """Wait until every I/O this tier has started (puts, gets, unlinks) has finished."""
        while True:
            with self._lock:
                pending = list(self._last_op.values())
            if not pending:
                return
            for f in pending:
                f.result()
            time.sleep(0)  # let the done-callbacks that retire these futures run

    def close(self) -> None:
        self.flush()
        if self._own_mover:
            self.mover.close()


    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # -- buckets: every entry sits in its group's node, the node in its class's bucket -------

    def _place(self, key: bytes) -> tuple[Hashable, int]:
        return self._ranks.place(key) if self._ranks is not None else (0, 0)

    def _add_entry(self, key: bytes, entry: Entry) -> None:
        self._entries[key] = entry
        node, cls = self._place(key)
        self._order.add(key, None, node, cls)

    def _pop_entry(self, key: bytes) -> Entry:
        entry = self._entries.pop(key)
        self._order.remove(key)
        return entry

    def _touch(self, key: bytes, entry: Entry) -> None:
        """An access: newest in its node, and its node newest in its class."""
        entry.last_access = self._tick()
        self._order.touch(key)

    def _touch_many(self, keys: list[bytes], entries: list[Entry]) -> None:
        """`_touch` of each, in order, as one call."""
        clock = self._clock
        for e in entries:
            clock += 1
            e.last_access = clock
        self._clock = clock
        self._order.touch_many(keys)

    def _refile(self, key: bytes, entry: Entry, regrouped: bool = False) -> None:
        node, cls = self._place(key)
        if node != self._order.node_of(key) or self._order.class_of(key) != cls:
            self._order.remove(key)
            held = self._ranks is not None and self._ranks.grouped and node != UNHELD_GROUP
            self._order.add(key, None, node, cls, front=regrouped and held)

    def _victims(self, n: int) -> list[bytes]:
        """Up to `n` ready keys: lowest class first, least recently used node first, least
        recently used key first inside it. O(n + classes + blocks still being written)."""
        out: list[bytes] = []
        if n <= 0:
            return out
        for key, _ in self._order.victims():
            if self._entries[key].ready:
                out.append(key)
                if len(out) >= n:
                    break
        return out

    def _make_room(self, num_new: int) -> int:
        """Evict so that up to `num_new` blocks fit; returns how many fit now."""
        free = self.capacity_blocks - len(self._entries)
        for key in self._victims(num_new - free):
            self._evict(key)
            free += 1
        return max(0, min(num_new, free))

    def _evict(self, key: bytes) -> None:
        self._stats.num_evicted += 1
        self._drop(key, evicted=True)

    def _check_entries(self) -> None:
        assert len(self._entries) <= self.capacity_blocks, (
            f"{self.name}: {len(self._entries)} blocks exceed capacity {self.capacity_blocks}")
        self._order.check_integrity()
        assert self._order._node_of.keys() == self._entries.keys(), (
            f"{self.name}: victim order out of sync with the index")
        if self._ranks is not None:
            assert all((node, c) == self._ranks.place(k) for k, _, node, c in self._order.items()), (
                f"{self.name}: an entry sits in a node or class the board no longer gives it")
        assert all(e.last_access <= self._clock for e in self._entries.values()), (
            f"{self.name}: an entry is newer than the clock")

    def _safe_on_evict(self, key: bytes, payload) -> None:
        if self._on_evict is None:
            return
        try:
            self._on_evict(key, payload)
        except Exception:  # a listener's bug must not corrupt the tier
            log.exception("%s: on_evict listener failed", self.name)
