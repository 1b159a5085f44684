"""The pool tier: a shared KV pool (`hintkv.pool` backend: embedded or Mooncake) behind the
`Tier` contract, at the bottom of the stack (device -> host -> disk -> pool). Every decision
about the index (known, owned, victims) is here; the I/O (op queue, worker, batched backend
calls) is `tiers.pool_worker`, which records each call's outcome into the index under the tier
lock (entries stored, deduplicated, missing); keys and frames are `tiers.pool_frames`.

What it adds to the contract:
  - Frames (`tiers.pool_frames`): a foreign, torn or racing blob is a miss, never wrong KV.
  - Content keys: the key is the block's chained hash, so two instances that compute the same
    block write the same key; a put first asks the pool whether the key is there and skips the
    transfer if so (`num_dedup`). Such a block is *known* here but *owned* by whoever stored it:
    this tier removes from the pool only what it stored itself, and (session-aware) never a block another
    instance keeps alive: an ended session's block and a capacity victim are both released (`backend.release`),
    which leaves a leased block in the pool (retried a while, then the pool's own eviction's).
  - Lookups reach the pool: `contains` of a key this instance never stored asks the backend, so
    a session that moves to another instance finds its prefix there.
  - Faults (`tiers.pool_worker`): timeouts and a circuit breaker (open: a miss / refused put).
  - `session_aware=False`: the plain-LRU pool the benchmark compares against (no engine victim
    order, no `remove`, no `keep_alive`: a store that knows nothing of sessions).

Capacity (`capacity_bytes`) counts the blocks known here (stored or found); `usage().bytes_used`
the frames stored here (summed over instances: the pool's real footprint).
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import filterfalse, repeat
from operator import attrgetter

import torch

from hintkv.openmp_env import serial_openmp_thread
from hintkv.pool.backend import PoolBackend
from hintkv.pool.breaker import CircuitBreaker
from hintkv.tiers.base import OnEvict, Tier, TierStats, TierUsage, Wants
from hintkv.tiers.disk_format import HEADER_SIZE
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.mover import resolved
from hintkv.tiers.pool_entries import PoolCounters, PoolEntry, PutBatch, Unavailable
from hintkv.tiers.pool_frames import PoolFrames
from hintkv.tiers.pool_worker import PoolWorker
from hintkv.tiers.ranks import RankBoard

log = logging.getLogger(__name__)

_PKEY = attrgetter("pkey")


class PoolTier(PoolFrames, PoolWorker, Tier):
    name = "pool"
    remote = True  # the stack reads it without probing first (see TierStack._load_from)

    def __init__(self, layout: BlockLayout, backend: PoolBackend, capacity_bytes: int,
                 session_aware: bool = True, timeout_s: float = 1.0,
                 breaker: CircuitBreaker | None = None, key_prefix: str = "hkv", secret: bytes = b"",
                 on_evict: OnEvict | None = None, write_through: bool = False) -> None:
        self.layout = layout
        self.backend = backend
        self.frame_nbytes = HEADER_SIZE + layout.nbytes
        self.capacity_blocks = max(0, capacity_bytes) // self.frame_nbytes
        self.session_aware = session_aware
        self.write_through = write_through  # SPM publishes each finished request's blocks (cache/spm.py)
        self.timeout_s = timeout_s
        self.breaker = breaker or CircuitBreaker()
        self.key_prefix = key_prefix
        self._key_head = f"{key_prefix}:"  # a block's pool key: this, then its hash in hex
        self.secret = secret[:64]  # BLAKE2b key: shared by the instances of one deployment
        self.upper = "disk"
        self._fingerprint = layout.fingerprint()
        self._ranks: RankBoard | None = None
        self._on_evict = on_evict
        self._lock = threading.RLock()
        self._entries: dict[bytes, PoolEntry] = {}
        self._num_owned = 0  # entries with `owned`, kept with every change (`bytes_used` per put)
        self._clock = 0
        self._stats = TierStats()
        self.counters = PoolCounters()
        self._ops: deque[tuple] = deque()
        self._releasing: dict[bytes, float] = {}  # leased elsewhere: retry until the deadline
        self._cv = threading.Condition()
        self._busy = False
        self._closing = False
        self._calls = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pool-call",
                                         initializer=serial_openmp_thread)  # no OpenMP pool beside the engine's
        self._calls_running = 0  # backend calls not finished (a timed-out one may still run)
        self._calls_cv = threading.Condition()
        self._worker = self._start_worker()

    # -- the contract -----------------------------------------------------------------------
    def contains(self, key: bytes) -> bool:
        return self.contains_many([key])[0]

    def contains_many(self, keys: list[bytes]) -> list[bool]:
        """Known here (stored or being stored), else asked of the pool in one call. While the
        pool is unreachable nothing is in it, as far as loads are concerned."""
        if self.breaker.is_open:
            return [False] * len(keys)
        with self._lock:
            out = [key in self._entries for key in keys]
        unknown = [k for k, known in zip(keys, out) if not known]
        if unknown:
            try:
                found = iter(self._call(self.backend.exists, [self.pool_key(k) for k in unknown]))
            except Unavailable:
                return [False] * len(keys)
            out = [known or next(found) for known in out]
        return out

    def known(self, key: bytes) -> bool:
        """Known here without asking the pool (no round trip)."""
        with self._lock:
            return key in self._entries

    def unknown_among(self, keys: Iterable[bytes]) -> list[bytes]:
        """The keys not known here, in their order (one lock, no round trip)."""
        with self._lock:
            return list(filterfalse(self._entries.__contains__, keys))

    def put(self, items: list[tuple[bytes, torch.Tensor]]) -> list[Future[bool]]:
        for key, src in items:
            self.layout.check_payload(src)
        out: list[Future[bool]] = []
        with self._lock:
            for key, _ in items:  # a re-put refreshes recency first, so it is not a victim
                if (e := self._entries.get(key)) is not None:
                    e.last_access = self._tick()
            fit = self._make_room(len({k for k, _ in items if k not in self._entries}))
            batch: PutBatch | None = None  # counted down under this lock: complete before any op runs
            for key, src in items:
                entry = self._entries.get(key)
                if entry is not None:
                    out.append(entry.write)
                elif fit == 0 or self.breaker.is_open:
                    self._stats.num_put_failed += 1
                    out.append(resolved(False))
                else:
                    fit -= 1
                    if batch is None:
                        batch = PutBatch(Future())
                    batch.left += 1
                    entry = PoolEntry(self._tick(), batch.write, owned=True,
                                      pkey=self.pool_key(key), stored=False)
                    self._entries[key] = entry
                    self._num_owned += 1
                    self._queue(("put", key, src, entry, batch))
                    out.append(batch.write)
            return out

    def get(self, key: bytes, dst: torch.Tensor) -> Future[bool]:
        self.layout.check_payload(dst)
        fut: Future[bool] = Future()
        with self._lock:
            if (e := self._entries.get(key)) is not None:
                e.last_access = self._tick()
        self._queue(("get", key, dst, fut))
        return fut

    def remove(self, key: bytes) -> bool:
        """Forget a block and remove it from the pool if this instance stored it. A plain
        (not session-aware) pool ignores removals: it only ever evicts."""
        if not self.session_aware:
            return False
        with self._lock:
            entry = self._pop(key)
            if entry is None:
                return False
            self._stats.num_removed += 1
        if entry.owned:
            self._queue(("release", key))
        return True

    def keep_alive(self, keys: Iterable[bytes], known_only: bool = False) -> int:
        """Refresh the pool's lease on blocks live sessions hold (one batched call, queued).
        `known_only`: send only those of `keys` (distinct) known here: SPM passes every held
        block, and one C-level pass filters and stamps them. Returns how many keys it sends."""
        if not self.session_aware:
            return 0
        with self._lock:  # each known key ticks in turn, as `_tick` per key would
            if known_only and not self._entries:  # nothing known: no pass over every held key
                return 0  # (4.9% of a 100-user simulation whose pool was never written)
            if known_only:
                found = list(filter(None, map(self._entries.get, keys)))
                pkeys = list(map(_PKEY, found))
            else:
                keys = list(keys)
                found = list(filter(None, map(self._entries.get, keys)))
                pkeys = list(dict.fromkeys(map(_PKEY, found) if len(found) == len(keys)
                                           else self.pool_keys(keys)))
            if not pkeys:
                return 0
            first = self._clock + 1
            self._clock += len(found)
            deque(map(setattr, found, repeat("last_access"), range(first, self._clock + 1)),
                  maxlen=0)
        self._queue(("keep", pkeys))
        return len(pkeys)

    def retry_releases(self) -> None:
        """Try again the releases a lease held back (a `keep_alive` pass does it too). Without a pass they
        waited for one: an instance whose last session ended sent none, and the master kept that session's
        blocks after our index let them go (measured with a real mooncake_master: 4 keys, 512 KB, still there
        10 s after the evict, 5 s lease)."""
        with self._lock:
            if not self._releasing:
                return
        self._queue(("retry",))

    def usage(self) -> TierUsage:
        with self._lock:
            return TierUsage(len(self._entries), self.capacity_blocks, self._bytes_used())

    def stats(self) -> TierStats:
        with self._lock:
            s = self._stats
            return TierStats(s.num_puts, s.num_put_failed, s.num_hits, s.num_misses,
                             s.num_corrupt, s.num_io_errors, s.num_evicted, s.num_removed)

    def pool_stats(self) -> dict:
        with self._lock:
            c = self.counters
            return {"bytes_now": self._bytes_used(), "bytes_peak": c.peak_bytes,
                    "puts": self._stats.num_puts, "gets": self._stats.num_hits,
                    "bytes_put": c.bytes_put, "bytes_got": c.bytes_got,
                    "dedup": c.num_dedup, "remote_hits": c.num_remote_hits,
                    "put_calls": c.num_put_calls, "get_calls": c.num_get_calls,
                    "keepalive_calls": c.num_keepalive_calls,
                    "keepalive_keys": c.num_keepalive_keys, "unavailable": c.num_unavailable,
                    "released": c.num_released, "release_leased": c.num_release_leased,
                    "lost": c.num_lost,
                    "available": int(not self.breaker.is_open),
                    "breaker_opened": self.breaker.num_opened,
                    "breaker_recovered": self.breaker.num_recovered}

    def set_ranks(self, ranks: RankBoard | None) -> None:
        """Victims by the engine's published class (session-aware); a plain pool ignores it."""
        with self._lock:
            self._ranks = ranks if self.session_aware else None

    def set_on_evict(self, on_evict: OnEvict | None, wants: Wants | None = None) -> None:
        """`wants` is moot: the pool reports no payload (nothing lies below it)."""
        with self._lock:
            self._on_evict = on_evict

    def last_access(self, key: bytes) -> int:
        with self._lock:
            e = self._entries.get(key)
            return e.last_access if e is not None else -1

    def check_integrity(self) -> None:
        """Waits for queued I/O; then the index is within capacity, and the blocks this instance
        stored that the pool no longer has (a master restarted between two calls, so no call
        failed and the breaker never re-checked) are forgotten, so the next write-through puts
        them again (`num_lost`): the pool is another process, its losses are not ours to assert."""
        self.flush()
        with self._lock:
            assert len(self._entries) <= self.capacity_blocks, (
                f"pool: {len(self._entries)} blocks exceed capacity {self.capacity_blocks}")
            assert all(e.write.done() for e in self._entries.values()), "pool: a put never finished"
            assert all(e.last_access <= self._clock for e in self._entries.values())
            owned = [k for k, e in self._entries.items() if e.owned and e.ready]
            num_owned = sum(1 for e in self._entries.values() if e.owned)
            assert num_owned == self._num_owned, (
                f"pool: {num_owned} owned entries, counted {self._num_owned}")
            assert all(e.pkey == self.pool_key(k) for k, e in self._entries.items())
        if owned and not self.breaker.is_open:
            try:
                there = self._call(self.backend.exists, [self.pool_key(k) for k in owned])
            except Unavailable:
                return
            with self._lock:
                self._forget_lost((k for k, ok in zip(owned, there) if not ok), "the integrity check")

    # -- eviction ---------------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _bytes_used(self) -> int:
        return self._num_owned * self.frame_nbytes

    def _pop(self, key: bytes) -> PoolEntry | None:
        """Forget an entry (every removal from the index goes here: keeps `_num_owned`)."""
        entry = self._entries.pop(key, None)
        if entry is not None and entry.owned:
            self._num_owned -= 1
        return entry

    def _make_room(self, num_new: int) -> int:
        free = self.capacity_blocks - len(self._entries)
        need = num_new - free
        if need > 0:
            # a scan of the index (a few thousand blocks per instance here; device, host and
            # disk keep class buckets instead)
            ready = [k for k, e in self._entries.items() if e.ready]
            ranks = self._ranks
            if ranks is None:
                def order(k):
                    return self._entries[k].last_access
            else:
                def order(k):
                    return (ranks.rank(k), self._entries[k].last_access)
            for key in heapq.nsmallest(need, ready, key=order):
                entry = self._pop(key)
                self._stats.num_evicted += 1
                free += 1
                if entry.owned:  # session-aware: as an ended session's block, it stays while another
                    # instance keeps it alive (its live session found it here); a plain store removes it
                    self._queue(("release" if self.session_aware else "remove", key))
                if self._on_evict is not None:
                    try:
                        self._on_evict(key, None)
                    except Exception:
                        log.exception("pool tier: on_evict listener failed")
        return max(0, min(num_new, free))
