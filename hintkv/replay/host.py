"""The host tier's bookkeeping for the offline replay: which blocks it holds, in policy order.

The live engine's `cache.tiering.TierLink` moves bytes on threads under a wall clock; the
offline replay needs only its decisions, on a virtual clock: on a device eviction the blocks
`keep` says (a live session holds them; every block when hints are off) are written down; the
tier evicts by the engine's ranking (lowest block class first, then least recently used on the
tier's own access clock, as the live tiers do); a prefix match continues into the tier;
`offload` writes a session's blocks down, `prefetch` brings them back. Victims are chosen in
batches of `max(overflow, capacity / 32)` so a full scan is paid once per batch (documented
difference: at most capacity/32 blocks leave early).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _HostBlock:
    hash: bytes
    last_access: int  # the tier's logical access clock


class HostBookkeeping:
    def __init__(self, capacity_blocks: int, block_class: Callable[[bytes], int],
                 keep: Callable[[bytes], bool]) -> None:
        self.capacity = capacity_blocks
        self.block_class = block_class
        self.keep = keep
        self.blocks: dict[bytes, _HostBlock] = {}
        self._clock = 0
        self.num_written = 0  # blocks stored (eviction write-downs + offloads)
        self.num_loaded = 0  # blocks read back into the device (requests + prefetches)
        self.num_evicted = 0
        self.num_removed = 0

    def __contains__(self, h: bytes) -> bool:
        return h in self.blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def put(self, hashes: list[bytes], force: bool = False) -> int:
        """Store the blocks `keep` accepts (all with `force`); returns how many were new."""
        if self.capacity <= 0:
            return 0
        new = 0
        for h in hashes:
            b = self.blocks.get(h)
            if b is not None:
                b.last_access = self._tick()
            elif force or self.keep(h):
                self.blocks[h] = _HostBlock(h, self._tick())
                new += 1
        self.num_written += new
        over = len(self.blocks) - self.capacity
        if over > 0:
            n = max(over, self.capacity // 32)
            cls = self.block_class
            for b in heapq.nsmallest(n, self.blocks.values(), key=lambda b: (cls(b.hash), b.last_access)):
                del self.blocks[b.hash]
            self.num_evicted += n
        return new

    def touch(self, h: bytes) -> None:
        self.blocks[h].last_access = self._tick()
        self.num_loaded += 1

    def remove(self, hashes: list[bytes]) -> int:
        n = 0
        for h in hashes:
            if self.blocks.pop(h, None) is not None:
                n += 1
        self.num_removed += n
        return n
