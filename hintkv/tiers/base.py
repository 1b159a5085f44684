"""The one contract every KV tier implements (host, disk, and later the shared pool).

A tier stores block payloads (see `layout.BlockLayout`) under opaque keys: the chained content
hash of the block, which already folds in the namespace (model, dtype, block layout, cache_salt).
A block is therefore stored at most once per tier, however many sessions hold it.

Invariants (each tier's `check_integrity()` asserts them):
  - `usage().num_blocks <= usage().capacity_blocks`, and `bytes_used` matches the blocks held.
  - every key the tier reports through `contains` has storage behind it, and no storage
    (slot, file) is held by a key the tier no longer knows: removal leaks nothing.

Semantics shared by all tiers:
  - `put(items)` is asynchronous and batched: it returns one future per item, resolving to True
    once the payload is stored, False if it could not be (full of blocks that cannot be evicted,
    I/O error). The caller must not modify a source tensor until its future resolves.
    Putting a key the tier already holds (or is writing) is a no-op success.
  - When full, a tier evicts ready blocks of the lowest eviction class first (the class the
    engine last published on the tier's `RankBoard`; 0 without one), least recently used first
    inside a class, without scanning the tier. Blocks still being written are never evicted. Each evicted block is
    reported to `on_evict(key, payload)`, under the tier's lock; `payload` is a tensor view
    valid only during the call (copy it to keep it), or None when the tier cannot provide the
    bytes. Every eviction is reported exactly once. A tier whose bytes cost a read (disk,
    `reads_back`) hands blocks down instead: see `tiers.hand_down`, the one statement of it.
  - `get(key, dst)` is asynchronous: True once `dst` holds the block's exact bytes; False on a
    miss, including a block that fails its checksum or an I/O error (the caller recomputes).
    On False the content of `dst` is undefined. Errors are counted and logged, never raised.
  - `remove(key)` forgets a block now; storage is reclaimed once in-flight reads of it finish.
  - `contains(key)` is a probe: it does not count as an access for eviction order. `known(key)`
    answers from the tier's own index, never a remote round trip (safe under another tier's lock).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.ranks import RankBoard

OnEvict = Callable[[bytes, "torch.Tensor | None"], None]
Wants = Callable[[bytes], bool]  # whether an eviction listener would keep the block's bytes


@dataclass(slots=True)
class TierUsage:
    num_blocks: int  # blocks held (including ones still being written)
    capacity_blocks: int
    bytes_used: int  # storage consumed by those blocks (payload, plus headers on disk)


@dataclass(slots=True)
class TierStats:
    """Event counters of one tier since it started (all monotonic)."""

    num_puts: int = 0  # blocks newly stored
    num_put_failed: int = 0  # puts refused (no evictable room) or failed (I/O error)
    num_hits: int = 0  # gets that delivered the bytes
    num_misses: int = 0  # gets of unknown keys, plus corrupt and failed reads
    num_corrupt: int = 0  # blocks dropped because their checksum, header or length was wrong
    num_io_errors: int = 0  # OSErrors met (ENOSPC, EROFS, EACCES, ...), all turned into misses
    num_evicted: int = 0  # blocks evicted to make room
    num_removed: int = 0  # blocks removed by `remove` (not one already evicted: `tiers.hand_down`)


class Tier(ABC):
    """One level of the KV hierarchy. See the module docstring for the contract."""

    name: str = "tier"
    upper: str = "device"  # where blocks come from; names transfer directions ("device->host")
    lower: str | None = None  # the tier evicted blocks go down to (set by the stack)
    reads_back = False  # evicted bytes cost a read: handed down (`tiers.hand_down`)
    # nominal read bandwidth into the device, bytes/s, where the tier connector's load estimate for this
    # tier starts (`cache.tier_costs`); None: not known (a default, and the tier is tried until measured)
    read_bps: float | None = None
    layout: BlockLayout  # the payload every block of this tier has

    @abstractmethod
    def contains(self, key: bytes) -> bool: ...

    def contains_many(self, keys: list[bytes]) -> list[bool]:
        """`contains` for many keys (a remote tier answers them in one round trip)."""
        return [self.contains(k) for k in keys]

    def known(self, key: bytes) -> bool:
        """`contains` from this tier's own index: never a remote round trip."""
        return self.contains(key)

    @abstractmethod
    def put(self, items: list[tuple[bytes, torch.Tensor]]) -> list[Future[bool]]: ...

    @abstractmethod
    def get(self, key: bytes, dst: torch.Tensor) -> Future[bool]: ...

    @abstractmethod
    def remove(self, key: bytes) -> bool: ...

    def remove_many(self, keys: list[bytes]) -> int:
        """`remove` for many keys; how many were removed."""
        return sum(self.remove(k) for k in keys)

    @abstractmethod
    def usage(self) -> TierUsage: ...

    @abstractmethod
    def stats(self) -> TierStats: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError, with a message, if an invariant of the contract is broken."""

    @abstractmethod
    def set_ranks(self, ranks: RankBoard | None) -> None:
        """Follow the eviction classes published on `ranks` (None: plain LRU). Called by the
        cache layer's tier connector; the tier subscribes to the board's changes."""

    @abstractmethod
    def set_on_evict(self, on_evict: OnEvict | None, wants: Wants | None = None) -> None:
        """Plug the eviction listener (the tier stack uses it to cascade blocks downward);
        `wants(key)`: the listener would keep this block's bytes (None: it never does)."""

    @abstractmethod
    def last_access(self, key: bytes) -> int:
        """Logical time of the key's last put or get (for priorities that tie-break by recency)."""

    @abstractmethod
    def flush(self) -> None:
        """Block until every I/O the tier has started (puts, gets, deletions) has finished."""

    @abstractmethod
    def close(self) -> None:
        """Finish in-flight I/O and release threads. Stored blocks are not deleted."""
