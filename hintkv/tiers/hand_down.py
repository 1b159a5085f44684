"""Hand-down: a tier whose bytes cost a read (disk, `reads_back`) gives an evicted block to the
tier below. This docstring is the contract; base.py, stack.py and disk.py point here.

    evict ─▶ wants(key)? ──no──▶ reported at once (payload None), file unlinked
                 └─yes─▶ _leaving[key] ─ mover: read back, checked ─▶ reported with the bytes
                          (contains / lookup / get still find it)     (the listener owns them),
                          remove(key) ─▶ cancelled: reported (None),   then the file unlinked
                                         never handed down

- The decision is made once, under the tier lock, at eviction (`wants`: the stack's "kept, and
  not already below", from the tier below's own index: `known`); the listener trusts a payload
  as kept and owns it (`Tier.reads_back`).
- Until the job ends the block is still this tier's: `contains`, `contains_many` (so the
  stack's `lookup`) count it, and `get` is served from the bytes read back, so a reader never
  sees it in no tier. `keys()`, `usage()` and `last_access()` do not see it: it is no longer
  an entry (its file, until unlinked, is not in `usage().bytes_used`).
- A `remove` / `remove_many` of a leaving key cancels the hand-down: the call counts it removed
  (returns it), its eviction is reported then, with None, and the tier below never gets it. A
  get already waiting on it is served as for any disk block removed mid-read: the job still
  reads the file for it; only a cancelled block with no waiting get is not read.
- Every eviction is reported exactly once, and every leaving key is released, however the job
  ends: read back, cancelled, failed checks (None), raised, or never run (the mover closed).
  The file is unlinked after it.
- Counting: the eviction in `num_evicted` (a cancelled block is not also `num_removed`); a
  read-back is a transfer "<tier>-><tier below>" (1 block, the payload's bytes), a failed one a
  failed transfer, a cancelled one with nothing to read neither (`mover.SKIPPED`).

`HandDown` is a mixin of `DiskTier` (before `IndexedTier`): it uses the tier's `_lock`,
`_entries`, `_stats`, `_wants`, `_after`, `_track`, `_safe_on_evict`, `mover`, `layout`,
`lower`, and the subclass's `_read_back(key) -> tensor | None` and `_unlink(path)`.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from pathlib import Path

import torch

from hintkv.tiers.mover import SKIPPED

log = logging.getLogger(__name__)


class Leaving:
    """An evicted block whose hand-down is queued: `read` resolves with its bytes once read back
    (None: not read, or failed its checks); `waiters`: gets waiting on it."""

    __slots__ = ("read", "waiters")

    def __init__(self) -> None:
        self.read: Future[torch.Tensor | None] = Future()
        self.waiters = 0


class HandDown:
    reads_back = True

    def __init__(self, *args, **kw) -> None:
        self._leaving: dict[bytes, Leaving] = {}  # evicted keys whose hand-down has not ended
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
            leaving.waiters += 1  # read back for it even if a remove cancels the hand-down
        out: Future[bool] = Future()
        leaving.read.add_done_callback(lambda f: out.set_result(self._serve(f.result(), dst)))
        return out

    def _serve(self, payload: torch.Tensor | None, dst: torch.Tensor) -> bool:
        ok = payload is not None
        try:
            if ok:
                dst.copy_(payload)
        except Exception:  # a callback must resolve its future: a miss, as any failed read
            log.exception("disk tier: serving a leaving block failed")
            ok = False
        with self._lock:
            self._count_reads(ok)
        return ok

    # -- removal cancels it ------------------------------------------------------------------

    def remove(self, key: bytes) -> bool:
        return self.remove_many([key]) == 1

    def remove_many(self, keys: list[bytes]) -> int:
        with self._lock:
            n = 0
            if self._leaving:
                for k in keys:
                    if self._cancel(k) and k not in self._entries:
                        n += 1  # counted evicted already, not also removed
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
        try:
            fut = self.mover.run(f"{self.name}->{self.lower}",
                                 lambda: self._hand_down(key, path, leaving), 1,
                                 self.layout.nbytes, after=self._after(key))
        except Exception:  # e.g. a simulated mover with no such link: not handed down
            log.exception("disk tier: cannot queue the hand-down of %s", key.hex())
            del self._leaving[key]
            return False
        fut.add_done_callback(lambda _: self._ended(key, path, leaving))
        self._track(key, fut)
        return True

    def _hand_down(self, key: bytes, path: Path, leaving: Leaving) -> object:
        """On the mover: read the block back (checked as any read) if it is still wanted or a get
        waits on it, serve those gets, report it with its bytes unless a remove cancelled it,
        unlink. True: read back; False: the read failed; SKIPPED: cancelled, nothing read."""
        with self._lock:
            read = self._leaving.get(key) is leaving or leaving.waiters > 0
        payload = self._read_back(key) if read else None
        self._release(key, leaving, payload)
        self._unlink(path)
        return SKIPPED if not read else payload is not None

    def _ended(self, key: bytes, path: Path, leaving: Leaving) -> None:
        """The job's done-callback: one that raised, or never ran (the mover closed), did not
        release the key; release it here, with no bytes, and unlink."""
        if not leaving.read.done():
            self._release(key, leaving, None)
            self._unlink(path)

    def _release(self, key: bytes, leaving: Leaving, payload: torch.Tensor | None) -> None:
        """Serve the waiting gets, then report the eviction (unless cancelled): the listener
        owns the bytes from then on."""
        leaving.read.set_result(payload)
        with self._lock:
            if self._leaving.get(key) is leaving:
                del self._leaving[key]
                self._safe_on_evict(key, payload)
