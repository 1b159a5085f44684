"""The host tier: one preallocated host buffer of block slots (pinned when copies go to CUDA).

Sized by `--host-cache-memory`. The buffer is `[capacity_blocks, *layout.shape]`, allocated once,
so the tier never allocates on the hot path; a free list of slot indices and a key -> slot map
are the whole bookkeeping. Copies in and out run on the movement engine.

Batched copies (`get_many`, `_write_many`) move whole slots as slice copies of runs (`host_copy.py`),
never by advanced indexing, on several threads when the buffer is pinned (a CUDA engine's).
"""

from __future__ import annotations

from concurrent.futures import Future

import torch

from hintkv.tiers.base import OnEvict
from hintkv.tiers.host_copy import copy_rows, copy_threads
from hintkv.tiers.index import Entry, IndexedTier
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.mover import Mover, gather, resolved
from hintkv.tiers.ranks import RankBoard


class HostTier(IndexedTier):
    name = "host"

    def __init__(self, layout: BlockLayout, capacity_bytes: int, pin: bool = False,
                 mover: Mover | None = None, ranks: RankBoard | None = None,
                 on_evict: OnEvict | None = None) -> None:
        super().__init__(layout, max(0, capacity_bytes) // layout.nbytes, mover, ranks,
                         on_evict)
        pin = pin and torch.cuda.is_available()  # pinning needs a CUDA driver; moot without one
        self._buf = torch.empty((self.capacity_blocks, *layout.shape), dtype=layout.dtype,
                                pin_memory=pin)
        self._copy_threads = copy_threads(pin)
        self._free = list(range(self.capacity_blocks - 1, -1, -1))  # pop() hands out slot 0 first

    batched_get = True  # `get_many` reads many blocks in one mover submission

    def get_many(self, keys: list[bytes], dst: torch.Tensor, rows: list[int]) -> Future[list[bool]]:
        """`get` of keys[j] into dst[rows[j]] for every j: the blocks ready here in ONE copy on
        the mover (a gather of their slots, ordered after each slot's previous I/O); a block
        still being written waits for its write, as `get` does. Results in key order."""
        if rows:  # rows of one tensor: one row's check stands for all (was a view per row)
            self.layout.check_payload(dst[rows[0]])
            if min(rows) < -len(dst) or max(rows) >= len(dst):
                raise IndexError(f"rows outside the {len(dst)}-row destination")
        with self._lock:
            ready: list[int] = []  # positions j in keys
            slots: list[int] = []
            parts: dict[int, Future[bool]] = {}
            # the ready ones are touched as one batch, in key order (flushed before a `get`,
            # which touches its own key: the order of touches is the keys')
            touched: list[bytes] = []
            touched_entries: list[Entry] = []
            for j, key in enumerate(keys):
                entry = self._entries.get(key)
                if entry is None:
                    self._stats.num_misses += 1
                    parts[j] = resolved(False)
                    continue
                if entry.ready:
                    touched.append(key)
                    touched_entries.append(entry)
                    ready.append(j)
                    slots.append(entry.slot)
                else:
                    self._touch_many(touched, touched_entries)
                    touched, touched_entries = [], []
                    parts[j] = self.get(key, dst[rows[j]])
            self._touch_many(touched, touched_entries)
            if ready:
                afters = [f for s in set(slots) if (f := self._after(s)) is not None]
                dst_rows = [rows[j] % len(dst) for j in ready]  # a negative row counts from the end

                def copy() -> bool:
                    copy_rows(dst, dst_rows, self._buf, slots, self._copy_threads)
                    return True
                raw = self.mover.run(f"{self.name}->{self.upper}", copy, len(ready),
                                     len(ready) * self.layout.nbytes,
                                     gather(afters) if afters else None)
                batch = self._finish_many(slots, raw, len(ready))
                for j in ready:
                    parts[j] = batch
        return gather([parts[j] for j in range(len(keys))])

    def check_integrity(self) -> None:
        with self._lock:
            self._check_entries()
            used = [e.slot for e in self._entries.values()]
            assert len(set(used)) == len(used), "host: two keys share a slot"
            assert len(set(self._free)) == len(self._free), "host: a slot is free twice"
            assert not set(used) & set(self._free), "host: a slot is both used and free"
            assert len(used) + len(self._free) == self.capacity_blocks, (
                f"host: {len(used)} used + {len(self._free)} free != {self.capacity_blocks} slots")

    # -- storage hooks ----------------------------------------------------------------------

    def _write(self, key: bytes, src: torch.Tensor) -> tuple[int, int, Future[bool]]:
        slot = self._free.pop()
        raw = self.mover.copy(f"{self.upper}->{self.name}", self._buf[slot], src,
                              after=self._after(slot))
        return slot, slot, raw

    batched_put = True  # a write-down batch is one gather into the buffer, one future

    def _write_many(self, keys: list[bytes], srcs: list[torch.Tensor]
                    ) -> tuple[list[int], Future[bool]]:
        slots = [self._free.pop() for _ in keys]
        afters = [f for s in slots if (f := self._after(s)) is not None]  # reads of old content

        def copy() -> bool:
            for slot, src in zip(slots, srcs):  # one memcpy each, no stacked copy
                self._buf[slot].copy_(src)
            return True
        raw = self.mover.run(f"{self.upper}->{self.name}", copy, len(keys),
                             len(keys) * self.layout.nbytes, gather(afters) if afters else None)
        return slots, raw

    def _read(self, key: bytes, entry: Entry, dst: torch.Tensor) -> tuple[int, Future[bool]]:
        raw = self.mover.copy(f"{self.name}->{self.upper}", dst, self._buf[entry.slot],
                              after=self._after(entry.slot))
        return entry.slot, raw

    def _drop(self, key: bytes, evicted: bool) -> None:
        entry = self._pop_entry(key)
        if evicted:  # the view is valid during the call: the slot is reused only after it
            self._safe_on_evict(key, self._buf[entry.slot])
        self._free.append(entry.slot)
