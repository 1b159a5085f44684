"""The host tier: one preallocated host buffer of block slots (pinned when copies go to CUDA).

Sized by `--host-cache-memory`. The buffer is `[capacity_blocks, *layout.shape]`, allocated once,
so the tier never allocates on the hot path; a free list of slot indices and a key -> slot map
are the whole bookkeeping. Copies in and out run on the movement engine.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

import torch

from hintkv.tiers.base import OnEvict, Priority, TierUsage
from hintkv.tiers.index import Entry, IndexedTier
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.mover import Mover, resolved

log = logging.getLogger(__name__)


class HostTier(IndexedTier):
    name = "host"

    def __init__(self, layout: BlockLayout, capacity_bytes: int, pin: bool = False,
                 mover: Mover | None = None, priority: Priority | None = None,
                 on_evict: OnEvict | None = None) -> None:
        super().__init__(layout, max(0, capacity_bytes) // layout.nbytes, mover, priority,
                         on_evict)
        pin = pin and torch.cuda.is_available()  # pinning needs a CUDA driver; moot without one
        self._buf = torch.empty((self.capacity_blocks, *layout.shape), dtype=layout.dtype,
                                pin_memory=pin)
        self._free = list(range(self.capacity_blocks - 1, -1, -1))  # pop() hands out slot 0 first

    def put(self, items: list[tuple[bytes, torch.Tensor]]) -> list[Future[bool]]:
        for _, src in items:
            self.layout.check_payload(src)
        with self._lock:
            new = {key for key, _ in items if key not in self._entries}
            fit = self._make_room(len(new))
            futures: list[Future[bool]] = []
            for key, src in items:
                entry = self._entries.get(key)
                if entry is not None:  # already held or being written: no-op success
                    entry.last_access = self._tick()
                    futures.append(entry.write)
                    continue
                if fit == 0:
                    self._stats.num_put_failed += 1
                    futures.append(resolved(False))
                    continue
                fit -= 1
                slot = self._free.pop()
                fut = self.mover.copy(f"{self.upper}->{self.name}", self._buf[slot], src,
                                      after=self._after(slot))
                entry = Entry(slot, self._tick(), fut)
                self._entries[key] = entry
                futures.append(self._finish_put(slot, key, entry, fut))
            return futures

    def get(self, key: bytes, dst: torch.Tensor) -> Future[bool]:
        self.layout.check_payload(dst)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._stats.num_misses += 1
                return resolved(False)
            entry.last_access = self._tick()
            if not entry.ready:
                return self._when_written(entry, lambda: self.get(key, dst))
            fut = self.mover.copy(f"{self.name}->{self.upper}", dst, self._buf[entry.slot],
                                  after=self._after(entry.slot))
            return self._finish_get(entry.slot, fut)

    def remove(self, key: bytes) -> bool:
        with self._lock:
            if key not in self._entries:
                return False
            self._stats.num_removed += 1
            self._drop(key, evicted=False)
            return True

    def usage(self) -> TierUsage:
        with self._lock:
            n = len(self._entries)
            return TierUsage(n, self.capacity_blocks, n * self.layout.nbytes)

    def check_integrity(self) -> None:
        with self._lock:
            self._check_entries()
            used = [e.slot for e in self._entries.values()]
            assert len(set(used)) == len(used), "host: two keys share a slot"
            assert len(set(self._free)) == len(self._free), "host: a slot is free twice"
            assert not set(used) & set(self._free), "host: a slot is both used and free"
            assert len(used) + len(self._free) == self.capacity_blocks, (
                f"host: {len(used)} used + {len(self._free)} free != {self.capacity_blocks} slots")

    # -- internals --------------------------------------------------------------------------

    def _drop(self, key: bytes, evicted: bool) -> None:
        entry = self._entries.pop(key)
        if evicted:  # the view is valid during the call: the slot is reused only after it
            self._safe_on_evict(key, self._buf[entry.slot])
        self._free.append(entry.slot)
