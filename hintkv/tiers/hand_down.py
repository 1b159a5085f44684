"""Hand-down: a tier whose bytes cost a read (disk) gives an evicted block to the tier below.

    evict ─▶ wants(key)? ──no──▶ reported at once (payload None), file unlinked
                 └─yes─▶ _leaving[key] ─ mover: read back, checked ─▶ reported with the bytes
                          (lookup / contains / get still find it)     (the listener owns them),
                          remove(key) ─▶ cancelled: reported (None),   then the file unlinked
                                         counted removed, never handed down

The decision is made once, under the tier lock, at eviction (`wants`: the stack's "kept, and not
already below"); the listener trusts a payload as kept. Until the hand-down lands the block is
still this tier's to serve: `contains` counts it and `get` is served from the bytes read back,
so a reader never sees it in no tier. A `remove` in that window cancels it (the edit that asked
for it sees the block removed, and the pool never gets it). Every eviction is reported exactly
once. The read-back is counted under "<tier>-><tier below>" (1 block, the payload's bytes); one
cancelled or failed counts as a failed transfer.

`HandDown` is a mixin of `DiskTier` (before `IndexedTier`): it uses the tier's `_lock`,
`_entries`, `_stats`, `_wants`, `_after`, `_track`, `mover`, `layout`, `lower`, and the
subclass's `_read_back(key) -> tensor | None` and `_unlink(path)`.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import torch

from hintkv.tiers.mover import resolved


class Leaving:
    """An evicted block whose hand-down is queued: `read` resolves with its bytes once read back
    (None: the file failed its checks, or the hand-down was cancelled before the read)."""

    __slots__ = ("read",)

    def __init__(self) -> None:
        self.read: Future[torch.Tensor | None] = Future()


class HandDown:
    reads_back = True  # the listener trusts a payload as wanted, and owns it (`Tier.reads_back`)

    def __init__(self, *args, **kw) -> None:
        self._leaving: dict[bytes, Leaving] = {}  # evicted keys whose hand-down is queued
        super().__init__(*args, **kw)

    # -- what still finds a leaving block ----------------------------------------------------

    def contains(self, key: bytes) -> bool:
        with self._lock:
            return key in self._entries or key in self._leaving

    def contains_many(self, keys: list[bytes]) -> list[bool]:
        with self._lock:
            if not self._leaving:
                return super().contains_many(keys)
            entries, leaving = self._entries, self._leaving
            return [k in entries or k in leaving for k in keys]

    def get(self, key: bytes, dst: torch.Tensor) -> Future[bool]:
        with self._lock:
            leaving = self._leaving.get(key) if key not in self._entries else None
            if leaving is None:
                return super().get(key, dst)
            self.layout.check_payload(dst)
            if leaving.read.done():  # read back, not yet reported: serve it now
                return resolved(self._serve(leaving.read.result(), dst))
        out: Future[bool] = Future()
        leaving.read.add_done_callback(lambda f: out.set_result(self._serve(f.result(), dst)))
        return out

    def _serve(self, payload: torch.Tensor | None, dst: torch.Tensor) -> bool:
        if payload is not None:
            dst.copy_(payload)
        with self._lock:
            if payload is not None:
                self._stats.num_hits += 1
            else:
                self._stats.num_misses += 1
        return payload is not None

    # -- removal cancels it ------------------------------------------------------------------

    def remove(self, key: bytes) -> bool:
        with self._lock:
            cancelled = self._cancel(key)
            removed = super().remove(key)
            if cancelled and not removed:
                self._stats.num_removed += 1
            return cancelled or removed

    def remove_many(self, keys: list[bytes]) -> int:
        with self._lock:
            n = 0
            if self._leaving:
                for k in keys:
                    if self._cancel(k) and k not in self._entries:
                        self._stats.num_removed += 1
                        n += 1
            return n + super().remove_many(keys)

    def _cancel(self, key: bytes) -> bool:
        """Lock held. A leaving key is gone now: its eviction reported without bytes."""
        if self._leaving.pop(key, None) is None:
            return False
        self._safe_on_evict(key, None)
        return True

    # -- eviction ----------------------------------------------------------------------------

    def _queue_hand_down(self, key: bytes, path: Path) -> bool:
        """Lock held, at eviction (the entry already popped): decide once whether the block is
        handed down and, if so, queue it after its file's last I/O (a new put of the key waits
        for it: `_track`). A key already leaving is not read twice: False."""
        if self._wants is None or key in self._leaving or not self._wants(key):
            return False
        leaving = self._leaving[key] = Leaving()
        fut = self.mover.run(f"{self.name}->{self.lower}",
                             lambda: self._hand_down(key, path, leaving), 1, self.layout.nbytes,
                             after=self._after(key))
        # a job that never ran (the mover closed) still lets waiting gets miss
        fut.add_done_callback(lambda _: leaving.read.done() or leaving.read.set_result(None))
        self._track(key, fut)
        return True

    def _hand_down(self, key: bytes, path: Path, leaving: Leaving) -> bool:
        """On the mover: read the block back (checked as any read) unless a remove cancelled it,
        serve the gets waiting on it, report it under the lock with its bytes (unless cancelled
        meanwhile), then unlink. True: read back and handed down."""
        with self._lock:
            wanted = self._leaving.get(key) is leaving
        payload = self._read_back(key) if wanted else None
        leaving.read.set_result(payload)
        with self._lock:
            handed = self._leaving.get(key) is leaving
            if handed:
                del self._leaving[key]
                self._safe_on_evict(key, payload)
        self._unlink(path)
        return handed and payload is not None
