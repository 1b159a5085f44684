"""The ordered hierarchy below the device pool: host, then disk (and later the shared pool).

    store(items) ─▶ tiers[0] ──evict──▶ keep(key)? ──yes──▶ tiers[1] ──evict──▶ ... ──▶ dropped
                                              └──no───▶ dropped (on_drop)
    load(key)    ◀─ first tier top-down that has it; a lower-tier hit is read into host staging,
                    promoted into tiers[0] when it has a free slot, then copied to `dst`

`keep(key)` is the cache manager's "some live session still holds this block": blocks nobody
holds are not worth a write to a slower tier. `on_drop(key)` hears of every evicted block that
was not passed down (an upper tier may still hold a promoted copy: ask `lookup`). Both run
under the evicting tier's lock: they must be quick and must not call into the tiers. A tier
whose bytes cost a read (disk) hands its evictions down from the mover: `tiers.hand_down`.

Each tier evicts by the classes on the engine's `RankBoard` (`Tier.set_ranks`). A failed read
on one tier (corrupt block, I/O error) falls through to the next tier that has the key, and
finally to a miss: the caller recomputes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from hintkv.tiers.base import Tier, TierStats, TierUsage
from hintkv.tiers.mover import Mover, MoverStats, gather

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StackStats:
    tiers: dict[str, TierStats]
    transfers: MoverStats  # bytes / blocks per direction, load wait, over all movers
    num_cascaded: int  # evicted blocks written one tier down (or already there)
    num_dropped: int  # evicted blocks that left the stack (not kept, or evicted from the bottom)
    num_promoted: int  # lower-tier hits copied up into tiers[0]
    num_spilled: int  # stored blocks the top tier refused, written to a lower tier instead


def leading_run(lookup: Callable[[list[bytes]], list[str | None]], keys: list[bytes],
                first: int = 16) -> list[str]:
    """`lookup`'s tiers of the leading run of `keys` (up to the first None), asked in doubling
    chunks: `TierStack.lookup_run`, and the write-downs' view of the stack (`cache.write_downs`)."""
    out: list[str] = []
    start, size = 0, first
    while start < len(keys):
        for tier in lookup(keys[start:start + size]):
            if tier is None:
                return out
            out.append(tier)
        start, size = start + size, size * 2
    return out


_TRUE: Future[bool] = Future()
_TRUE.set_result(True)


class TierStack:
    """Ordered tiers (top first). `keep` defaults to keeping every evicted block (a plain
    victim cache) until the cache manager plugs its own through the constructor or `set_keep`."""

    def __init__(self, tiers: list[Tier], keep: Callable[[bytes], bool] | None = None,
                 on_drop: Callable[[bytes], None] | None = None,
                 mover: Mover | None = None, owns_mover: bool = False) -> None:
        """`mover` runs the last hop of lower-tier loads (default: the top tier's); the stack
        closes it on `close()` if it made it or `owns_mover` says so."""
        if not tiers:
            raise ValueError("a tier stack needs at least one tier")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be distinct, got {names}")
        self.tiers = tiers
        self.layout = tiers[0].layout
        if any(t.layout != self.layout for t in tiers):
            raise ValueError("all tiers must store the same block layout")
        self._keep = keep or (lambda key: True)
        self._on_drop = on_drop
        if mover is None and getattr(tiers[0], "mover", None) is None:
            mover, owns_mover = Mover(num_workers=1), True
        self._own_mover = owns_mover
        self.mover: Mover = mover or tiers[0].mover  # type: ignore[attr-defined]
        self._lock = threading.Lock()
        self._num_cascaded = self._num_dropped = self._num_promoted = self._num_spilled = 0
        for i, tier in enumerate(tiers):
            tier.upper = "device" if i == 0 else tiers[i - 1].name
            tier.lower = tiers[i + 1].name if i + 1 < len(tiers) else None
            # `wants`: what a tier must read back to hand down (disk) is read only if kept
            tier.set_on_evict(lambda key, payload, i=i: self._evicted(i, key, payload),
                              wants=(lambda key, i=i: self._wants(i, key))
                              if i + 1 < len(tiers) else None)

    def set_keep(self, keep: Callable[[bytes], bool] | None) -> None:
        """The cache manager's keep rule (None: keep every block)."""
        self._keep = keep or (lambda key: True)

    def lookup(self, keys: list[bytes]) -> list[str | None]:
        """For each key, the name of the first tier (top-down) that holds it, else None."""
        if not keys or not self.tiers:
            return [None] * len(keys)
        top = self.tiers[0]  # the first tier asks for every key: no index lists (a session's chain)
        found = top.contains_many(keys)
        out: list[str | None] = list(map({True: top.name, False: None}.__getitem__, found))  # (C)
        if len(self.tiers) == 1:
            return out
        todo = [i for i, ok in enumerate(found) if not ok]
        for t in self.tiers[1:]:
            if not todo:
                break
            found = t.contains_many([keys[i] for i in todo])
            for i, ok in zip(todo, found):
                if ok:
                    out[i] = t.name
            todo = [i for i, ok in zip(todo, found) if not ok]
        return out

    def lookup_run(self, keys: list[bytes], first: int = 16) -> list[str]:
        """The tiers of the leading run of `keys` some tier holds (`lookup` up to the first
        miss), asked in doubling chunks so a long cold tail costs about the run's length."""
        return leading_run(self.lookup, keys, first)

    def store(self, items: list[tuple[bytes, torch.Tensor]]) -> list[Future[bool]]:
        """Offload blocks into the top tier (see `Tier.put`: keep sources intact until done).
        Blocks a tier refuses at once (no evictable room: e.g. a batch larger than the tier)
        spill to the next tier down."""
        futures: list[Future[bool] | None] = [None] * len(items)
        todo = list(range(len(items)))
        for depth, tier in enumerate(self.tiers):
            got = tier.put([items[i] for i in todo])
            refused = []
            for i, f in zip(todo, got):
                futures[i] = f
                if f.done() and not f.result():
                    refused.append(i)
            if depth > 0:
                with self._lock:
                    self._num_spilled += len(todo) - len(refused)
            todo = refused
            if not todo:
                break
        return futures  # type: ignore[return-value]

    def load(self, key: bytes, dst: torch.Tensor) -> Future[bool]:
        """Copy the block into `dst` from whichever tier has it; False: recompute it."""
        out: Future[bool] = Future()
        self._load_from(0, key, dst, out)
        return out

    def load_many(self, keys: list[bytes], dst: torch.Tensor) -> Future[list[bool]]:
        """`load` of keys[i] into dst[i] for every i, as one future of their results. Blocks the
        top tier holds are read in one batched transfer when it can (`get_many`: one mover
        submission, not one per block); the others, and any block of the batch that failed,
        go down the stack one by one as `load` does."""
        top = self.tiers[0]
        if not getattr(top, "batched_get", False) or not keys:
            return gather([self.load(k, dst[i]) for i, k in enumerate(keys)])
        found = top.contains_many(keys)
        here = [i for i, f in enumerate(found) if f]
        parts: list[Future[bool] | None] = [None] * len(keys)
        for i, f in enumerate(found):
            if not f:
                parts[i] = self.load(keys[i], dst[i])
        out: Future[list[bool]] = Future()
        batch = top.get_many([keys[i] for i in here], dst, here)  # type: ignore[attr-defined]

        def landed(f: Future[list[bool]]) -> None:
            try:
                for i, ok in zip(here, f.result()):
                    if ok:
                        parts[i] = _TRUE
                    else:  # fell through: the next tiers down, one block at a time
                        parts[i] = retry = Future()
                        self._load_from(1, keys[i], dst[i], retry)
                gather(parts).add_done_callback(lambda g: out.set_result(g.result()))  # type: ignore[arg-type]
            except Exception:
                log.exception("tier stack: batched load failed")
                if not out.done():
                    out.set_result([False] * len(keys))

        batch.add_done_callback(landed)
        return out

    def wait_loads(self, futures: list[Future[bool]]) -> list[bool]:
        """Block until the loads finish; the time blocked is counted as load wait."""
        return self.mover.wait_loads(futures)

    def remove_everywhere(self, key: bytes) -> bool:
        removed = [t.remove(key) for t in self.tiers]
        return any(removed)

    def usage(self) -> dict[str, TierUsage]:
        return {t.name: t.usage() for t in self.tiers}

    def stats(self) -> StackStats:
        movers = {id(m): m for m in [self.mover, *(getattr(t, "mover", None)
                                                   for t in self.tiers)] if m is not None}
        transfers = MoverStats()
        for m in movers.values():
            transfers = transfers.merged(m.stats())
        # each tier's stats under its own lock, never under the stack's: a tier calls the stack
        # (`_evicted`) while it holds its lock, so holding ours while waiting for a tier's deadlocks
        tiers = {t.name: t.stats() for t in self.tiers}
        with self._lock:
            return StackStats(tiers, transfers, self._num_cascaded, self._num_dropped,
                              self._num_promoted, self._num_spilled)

    def flush(self) -> None:
        """Wait for all in-flight I/O: top-down twice, since a lower-tier read may promote a
        block back up."""
        for _ in range(2):
            for t in self.tiers:
                t.flush()

    def check_integrity(self) -> None:
        for t in self.tiers:
            t.check_integrity()

    def close(self) -> None:
        for t in self.tiers:
            t.close()
            t.set_on_evict(None)  # its listener held this stack, which holds it: unplugged, no cycle is left
        if self._own_mover:
            self.mover.close()

    # -- internals --------------------------------------------------------------------------

    def _wants(self, i: int, key: bytes) -> bool:
        """`wants` of tier i's hand-down (`tiers.hand_down`): kept, and not already below.
        `known`, never `contains`: no pool round trip under a tier lock."""
        return not self.tiers[i + 1].known(key) and self._keep(key)  # `_keep`: late-bound

    def _evicted(self, i: int, key: bytes, payload: torch.Tensor | None) -> None:
        """Called by tier i, under its lock. A `reads_back` tier's payload was already decided
        and is given away (`tiers.hand_down`); any other's is a view valid only during the call,
        kept if `keep` says so. Only calls downward (tier i+1), so tier locks are taken top-down."""
        tier = self.tiers[i]
        below = self.tiers[i + 1] if i + 1 < len(self.tiers) else None
        if below is not None and payload is not None and (tier.reads_back or self._keep(key)):
            below.put([(key, payload if tier.reads_back else payload.clone())])
            with self._lock:
                self._num_cascaded += 1
            return
        if below is not None and payload is None and below.known(key):  # already below: kept
            with self._lock:
                self._num_cascaded += 1
            return
        with self._lock:
            self._num_dropped += 1
        if self._on_drop is not None:
            self._on_drop(key)

    def _load_from(self, start: int, key: bytes, dst: torch.Tensor, out: Future[bool]) -> None:
        # a remote tier (the pool) is asked directly: its get is one round trip, contains + get two
        i = next((j for j in range(start, len(self.tiers))
                  if getattr(self.tiers[j], "remote", False) or self.tiers[j].contains(key)), None)
        if i is None:
            out.set_result(False)
            return
        if i == 0:
            got = self.tiers[0].get(key, dst)
            got.add_done_callback(self._guard(out, lambda ok: out.set_result(True) if ok
                                              else self._load_from(1, key, dst, out)))
            return
        staging = self.mover.staging(self.layout.shape, self.layout.dtype)

        def fetched(ok: bool) -> None:
            if not ok:
                self._load_from(i + 1, key, dst, out)
                return
            top = self.tiers[0]
            usage = top.usage()
            if usage.num_blocks < usage.capacity_blocks:
                top.put([(key, staging)])  # staging is ours alone: never written again
                with self._lock:
                    self._num_promoted += 1
            copied = self.mover.copy(f"{self.tiers[0].name}->device", dst, staging)
            copied.add_done_callback(self._guard(out, out.set_result))

        self.tiers[i].get(key, staging).add_done_callback(self._guard(out, fetched))

    @staticmethod
    def _guard(out: Future[bool], fn: Callable[[bool], None]) -> Callable[[Future], None]:
        """A done-callback running `fn(result)`; any error resolves `out` to a miss instead of
        leaving it pending forever."""
        def callback(f: Future) -> None:
            try:
                fn(f.result())
            except Exception:
                log.exception("tier stack: load step failed")
                if not out.done():
                    out.set_result(False)
        return callback
