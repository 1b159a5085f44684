"""The futures a storage tier hands out, and the per-storage ordering of its I/O.

A slot or file can be reused or unlinked while a read of its old content is still in flight.
Every I/O on one storage unit is started `after` the previous one (see `Mover.run`): `_last_op`
keeps the latest I/O per unit until it finishes, so a read always sees the bytes that were there
when it was asked for. The futures a tier returns resolve after its counters and index were
updated (whoever saw one resolve sees the outcome recorded). A write-down batch (`put` of many
blocks on a tier with `batched_put`) is ONE transfer and ONE future, shared by its entries.

`TierIO` is a mixin of `IndexedTier`: it uses the tier's `_lock`, `_stats`, `_entries`,
`_last_op`, `_drop` and `name`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Entry:
    slot: int  # host: row of the preallocated buffer; disk: -1 (the file is named by the key)
    last_access: int  # logical clock of the last put or get
    write: Future[bool]  # the put that stores it (handed again to duplicate puts)
    # the write succeeded, recorded by its completion under the tier lock (`TierIO`): `ready`
    # is read per block on every load and victim choice, and `write.done()` + `result()` took
    # two lock round trips each (30-40% of a 128-block host load's CPU)
    written: bool = False

    @property
    def ready(self) -> bool:
        """The write succeeded: the bytes can be read, and the block may be evicted."""
        return self.written


class TierIO:
    """Completion and ordering of a tier's transfers (mixin; see the module docstring)."""

    def _after(self, unit: Hashable) -> Future | None:
        return self._last_op.get(unit)

    def _finish_put(self, unit: Hashable, key: bytes, entry: Entry,
                    raw: Future[bool]) -> Future[bool]:
        """Make `entry.write` the put's public future, the latest I/O on `unit`; it resolves
        after the outcome is recorded, so whoever saw it resolve sees stats and index updated."""
        def record(ok: bool) -> bool:
            with self._lock:
                if ok:
                    self._stats.num_puts += 1
                    entry.written = True
                else:
                    self._stats.num_put_failed += 1
                    if self._entries.get(key) is entry:
                        self._drop(key, evicted=False)
            return ok
        entry.write = self._finish(unit, raw, record)
        return entry.write

    def _finish_get(self, unit: Hashable, raw: Future[bool]) -> Future[bool]:
        """The get's public future, the latest I/O on `unit`: resolves after the hit or miss
        is counted."""
        def record(ok: bool) -> bool:
            with self._lock:
                self._count_reads(ok)
            return ok
        return self._finish(unit, raw, record)

    def _finish_many(self, units: list[Hashable], raw: Future[bool], n: int) -> Future[bool]:
        """`_finish_get` for one transfer that reads `n` blocks from `units` at once: the latest
        I/O on each of them; counts n hits or n misses."""
        out: Future[bool] = Future()

        def record(ok: bool) -> None:
            self._count_reads(ok, n)
        self._finish_batch(units, raw, out, "a batched read", record)
        return out

    def _count_reads(self, ok: bool, n: int = 1) -> None:
        """n hits or n misses (the caller holds the tier lock)."""
        if ok:
            self._stats.num_hits += n
        else:
            self._stats.num_misses += n

    def _finish(self, unit: Hashable, raw: Future[bool],
                record: Callable[[bool], bool]) -> Future[bool]:
        out: Future[bool] = Future()
        self._track(unit, out)  # before `record` can run: it may queue newer I/O on `unit`

        def done(f: Future[bool]) -> None:
            ok = self._outcome(f, "a transfer")
            try:
                ok = record(ok)
            except Exception:
                log.exception("%s: recording a transfer failed", self.name)
                ok = False
            out.set_result(ok)

        raw.add_done_callback(done)
        return out

    def _finish_batch(self, units: list[Hashable], raw: Future[bool], out: Future[bool],
                      what: str, record: Callable[[bool], None]) -> None:
        """One transfer for many units: `out` is the latest I/O on each of them until `raw`
        finishes; then `record(ok)` runs under the tier lock and `out` resolves."""
        for unit in units:
            self._last_op[unit] = out

        def done(f: Future[bool]) -> None:
            ok = self._outcome(f, what)
            with self._lock:
                record(ok)
                for unit in units:
                    if self._last_op.get(unit) is out:
                        del self._last_op[unit]
            out.set_result(ok)

        raw.add_done_callback(done)

    def _outcome(self, f: Future[bool], what: str) -> bool:
        """A finished transfer's result; False (logged) when it raised."""
        try:
            return bool(f.result())
        except Exception:
            log.exception("%s: %s failed", self.name, what)
            return False

    def _track(self, unit: Hashable, fut: Future) -> Future:
        """Record `fut` as the latest I/O on `unit` (until it finishes)."""
        self._last_op[unit] = fut

        def done(_: Future) -> None:
            with self._lock:
                if self._last_op.get(unit) is fut:
                    del self._last_op[unit]

        fut.add_done_callback(done)
        return fut

    def _when_written(self, entry: Entry, retry: Callable[[], Future[bool]]) -> Future[bool]:
        """For a get of a block still being written: wait for the write, then `retry` the get
        (a failed write is a miss)."""
        out: Future[bool] = Future()

        def written(w: Future[bool]) -> None:
            if not w.result():
                with self._lock:
                    self._stats.num_misses += 1
                out.set_result(False)
                return
            try:
                retry().add_done_callback(lambda f: out.set_result(f.result()))
            except Exception:
                log.exception("%s: get after write failed", self.name)
                out.set_result(False)

        entry.write.add_done_callback(written)
        return out

    def _finish_put_many(self, units: list[Hashable], keys: list[bytes], entries: list[Entry],
                         raw: Future[bool], out: Future[bool]) -> None:
        """`_finish_put` for a batch written in one transfer: `out` (every entry's `write`) is
        the latest I/O on each unit and resolves once n puts (or n failures, the entries
        dropped) are recorded."""
        def record(ok: bool) -> None:
            if ok:
                self._stats.num_puts += len(keys)
                for entry in entries:
                    entry.written = True
                return
            self._stats.num_put_failed += len(keys)
            for key, entry in zip(keys, entries):
                if self._entries.get(key) is entry:
                    self._drop(key, evicted=False)
        self._finish_batch(units, raw, out, "a batched write", record)
