"""The pool tier: a shared KV pool (`hintkv.pool` backend: embedded or Mooncake) behind the
`Tier` contract, at the bottom of the stack (device -> host -> disk -> pool).

    put / get / remove / keep_alive ──▶ op queue ──▶ worker: consecutive ops of one kind become
                                                    ONE batched backend call (timeout + breaker)

What it adds to the contract:
  - Frames: each block is stored as `disk_format` header (key, layout fingerprint, length, and a
    BLAKE2b MAC of the payload keyed by `secret`, which the instances of one deployment share:
    `HINTKV_POOL_SECRET`; empty, it is a plain checksum) + payload, and every read checks all of
    it: a blob from another model or layout, a torn write, a key racing its removal, all turn
    into a miss (recompute), never into wrong KV.
  - Content keys: the key is the block's chained hash, so two instances that compute the same
    block write the same key; a put first asks the pool whether the key is there and skips the
    transfer if so (`num_dedup`). Such a block is *known* here but *owned* by whoever stored it:
    this tier removes from the pool only what it stored itself.
  - Lookups reach the pool: `contains` of a key this instance never stored asks the backend, so
    a session that moves to another instance finds its prefix there.
  - Faults: every backend call has a timeout; failures open a `CircuitBreaker`, and while it is
    open every call is a miss / refused put at once (serving goes on from the local tiers). When
    a probe succeeds the tier re-checks its index against the pool (a restarted master holds
    nothing) and goes on by itself.
  - `session_aware=False` is the plain-LRU pool the benchmark compares against: it ignores the
    engine's victim order and every `remove` (a store that knows nothing of sessions), and
    `keep_alive` does nothing.

Capacity (`capacity_bytes`) counts the blocks this instance knows in the pool (stored or found);
`usage().bytes_used` counts the frames it stored itself, so summed over instances it is the
pool's real footprint.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from itertools import chain, filterfalse, repeat
from operator import attrgetter

import torch

from hintkv.pool.backend import BackendError, PoolBackend
from hintkv.pool.breaker import CircuitBreaker
from hintkv.tiers.base import OnEvict, Tier, TierStats, TierUsage
from hintkv.tiers.disk_format import (
    HEADER_SIZE,
    BadBlockFile,
    block_mac,
    decode_header,
    encode_header,
)
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.mover import resolved
from hintkv.tiers.ranks import RankBoard

log = logging.getLogger(__name__)


_PKEY = attrgetter("pkey")
RELEASE_RETRY_S = 30.0  # how long a leased block's release is retried
CLOSE_WAIT_S = 30.0  # close() waits this long for a hanging backend call to return


class Unavailable(Exception):
    """The pool is not reachable now (breaker open, timeout, backend error)."""


@dataclass(slots=True)
class PoolEntry:
    last_access: int  # logical clock of the last put / get / keep-alive
    write: Future[bool]  # the put that stores it (one per `put` call, shared by its new blocks)
    owned: bool  # stored by this instance (False: found there already, or only read from there)
    pkey: str  # its pool key, made once (keep-alive sends it every second; its hash is cached)
    stored: bool = True  # its own put succeeded (False while it runs, and if it failed)

    @property
    def ready(self) -> bool:
        return self.stored and self.write.done()


@dataclass(slots=True)
class _PutBatch:
    """The new blocks of one `put` call: ONE future, True once every one of them is stored
    (False if any failed; each entry's own outcome is `PoolEntry.stored`)."""

    write: Future[bool]
    left: int = 0  # blocks not processed yet
    ok: bool = True


@dataclass(slots=True)
class PoolCounters:
    """Pool-specific counters (monotonic), next to the tier's `TierStats`."""

    num_dedup: int = 0  # puts skipped: the pool held the key already (content keys)
    num_remote_hits: int = 0  # hits on blocks this instance did not store
    bytes_put: int = 0
    bytes_got: int = 0
    num_put_calls: int = 0  # batched backend calls
    num_get_calls: int = 0
    num_keepalive_calls: int = 0
    num_keepalive_keys: int = 0
    num_unavailable: int = 0  # operations skipped or failed because the pool was unreachable
    peak_bytes: int = 0  # the most `bytes_used` has been
    num_released: int = 0  # ended sessions' blocks removed from the pool
    num_release_leased: int = 0  # release attempts refused: another instance kept it alive


class PoolTier(Tier):
    name = "pool"
    remote = True  # the stack reads it without probing first (see TierStack._load_from)

    def __init__(self, layout: BlockLayout, backend: PoolBackend, capacity_bytes: int,
                 session_aware: bool = True, timeout_s: float = 1.0,
                 breaker: CircuitBreaker | None = None, key_prefix: str = "hkv",
                 secret: bytes = b"",
                 on_evict: OnEvict | None = None, write_through: bool = True) -> None:
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
        self._calls = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pool-call")
        self._calls_running = 0  # backend calls not finished (a timed-out one may still run)
        self._calls_cv = threading.Condition()
        self._worker = self._start_worker()

    def _start_worker(self) -> threading.Thread | None:
        """The thread that runs queued ops (the simulator runs them on its event clock instead)."""
        worker = threading.Thread(target=self._run, name="pool-worker", daemon=True)
        worker.start()
        return worker

    # -- keys and frames --------------------------------------------------------------------
    def pool_key(self, key: bytes) -> str:
        return self._key_head + key.hex()

    def pool_keys(self, keys: Iterable[bytes]) -> list[str]:
        """`pool_key` of each, made in C (keep-alive sends every live block once a second)."""
        return list(map(self._key_head.__add__, map(bytes.hex, keys)))

    def _frames(self, items: list[tuple[bytes, torch.Tensor]]) -> list[torch.Tensor]:
        """Each block's frame (header + payload), all in one buffer: one copy of the payloads,
        then a MAC and a header per block (a put batch is a prompt's thousands of blocks)."""
        blobs = torch.empty((len(items), self.frame_nbytes), dtype=torch.uint8)
        payloads = torch.stack([src.detach().reshape(-1) for _, src in items])
        blobs[:, HEADER_SIZE:] = payloads.cpu().view(torch.uint8)
        bodies = blobs[:, HEADER_SIZE:].numpy()
        fp, nbytes, secret = self._fingerprint, self.layout.nbytes, self.secret
        headers = b"".join(encode_header(key, fp, nbytes, block_mac(secret, key, fp, body))
                           for (key, _), body in zip(items, bodies))
        blobs[:, :HEADER_SIZE] = torch.frombuffer(bytearray(headers), dtype=torch.uint8).view(
            len(items), HEADER_SIZE)
        return list(blobs.unbind(0))

    def _unframe(self, key: bytes, blob: torch.Tensor, dst: torch.Tensor) -> bool:
        try:
            _, mac = decode_header(blob[:HEADER_SIZE].numpy().tobytes(), self._fingerprint,
                                   self.layout.nbytes, key)
            if block_mac(self.secret, key, self._fingerprint, blob[HEADER_SIZE:].numpy()) != mac:
                raise BadBlockFile("payload MAC mismatch")
        except BadBlockFile as e:
            log.warning("pool tier: dropping block %s: %s", key.hex(), e)
            with self._lock:
                self._stats.num_corrupt += 1
            return False
        payload = blob[HEADER_SIZE:].view(self.layout.dtype).view(self.layout.shape)
        dst.copy_(payload)
        return True

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
            batch: _PutBatch | None = None  # counted down under this lock: complete before any op runs
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
                        batch = _PutBatch(Future())
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
                    "available": int(not self.breaker.is_open),
                    "breaker_opened": self.breaker.num_opened,
                    "breaker_recovered": self.breaker.num_recovered}

    def set_ranks(self, ranks: RankBoard | None) -> None:
        """Victims by the engine's published class (session-aware); a plain pool ignores it."""
        with self._lock:
            self._ranks = ranks if self.session_aware else None

    def set_on_evict(self, on_evict: OnEvict | None) -> None:
        with self._lock:
            self._on_evict = on_evict

    def last_access(self, key: bytes) -> int:
        with self._lock:
            e = self._entries.get(key)
            return e.last_access if e is not None else -1

    def flush(self) -> None:
        with self._cv:
            while self._ops or self._busy:
                self._cv.wait()

    def check_integrity(self) -> None:
        """Waits for queued I/O; then the index is within capacity and, if the pool is up,
        every block this instance stored is really there."""
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
            missing = sum(1 for ok in there if not ok)
            assert missing == 0, f"pool: {missing} stored blocks are not in the pool"

    def close(self) -> None:
        self.flush()
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._worker.join(timeout=5)
        self._calls.shutdown(wait=False, cancel_futures=True)
        with self._calls_cv:  # a call that timed out may still be inside the client library
            idle = self._calls_cv.wait_for(lambda: self._calls_running == 0, timeout=CLOSE_WAIT_S)
        if idle:
            self.backend.close()
        else:  # closing the client under a running call would crash the process
            log.warning("pool tier: a pool call is still hanging; leaving the client open")

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
                if entry.owned:
                    self._queue(("remove", key))
                if self._on_evict is not None:
                    try:
                        self._on_evict(key, None)
                    except Exception:
                        log.exception("pool tier: on_evict listener failed")
        return max(0, min(num_new, free))

    # -- the worker -------------------------------------------------------------------------
    def _queue(self, op: tuple) -> None:
        with self._cv:
            self._ops.append(op)
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._ops and not self._closing:
                    self._cv.wait()
                if not self._ops:
                    return
                ops = list(self._ops)
                self._ops.clear()
                self._busy = True
            try:
                start = 0
                while start < len(ops):  # runs of one kind, in arrival order
                    end = start
                    while end < len(ops) and ops[end][0] == ops[start][0]:
                        end += 1
                    self._process(ops[start][0], ops[start:end])
                    start = end
            except Exception:
                log.exception("pool tier: worker failed")
                for op in ops:
                    fut = op[3].write if op[0] == "put" else op[3] if op[0] == "get" else None
                    if fut is not None and not fut.done():
                        fut.set_result(False)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _call(self, fn, *args):
        """Run a backend call with the timeout, through the breaker; Unavailable on failure."""
        if not self.breaker.allow():
            with self._lock:
                self.counters.num_unavailable += 1
            raise Unavailable()
        with self._calls_cv:
            self._calls_running += 1
        try:
            call = self._calls.submit(fn, *args)
        except RuntimeError:  # shut down
            self._call_done(None)
            raise Unavailable() from None
        call.add_done_callback(self._call_done)
        try:
            result = call.result(timeout=self.timeout_s)
        except (FutureTimeout, BackendError) as e:
            log.warning("pool tier: %s failed: %s", getattr(fn, "__name__", "call"),
                        e or "timed out")
            self.breaker.failure()
            with self._lock:
                self.counters.num_unavailable += 1
                self._stats.num_io_errors += 1
            raise Unavailable() from e
        if self.breaker.success():
            log.info("pool tier: the pool is reachable again; re-checking what it holds")
            self._queue(("resync",))
        return result

    def _call_done(self, _: Future | None) -> None:
        with self._calls_cv:
            self._calls_running -= 1
            self._calls_cv.notify_all()

    def _process(self, kind: str, ops: list[tuple]) -> None:
        if kind == "put":
            self._do_puts([(op[1], op[2], op[3], op[4]) for op in ops])
        elif kind == "get":
            self._do_gets([(op[1], op[2], op[3]) for op in ops])
        elif kind == "remove":
            try:
                self._call(self.backend.remove, [self.pool_key(op[1]) for op in ops])
            except Unavailable:
                pass  # an unreachable pool is emptied by its master's own eviction (or restart)
        elif kind == "release":
            self._release([op[1] for op in ops])
        elif kind == "keep":
            # each op's keys are distinct (`keep_alive`): only several need merging
            keys = (ops[0][1] if len(ops) == 1
                    else list(dict.fromkeys(chain.from_iterable(op[1] for op in ops))))
            try:
                self._call(self.backend.keep_alive, keys)
                with self._lock:
                    self.counters.num_keepalive_calls += 1
                    self.counters.num_keepalive_keys += len(keys)
            except Unavailable:
                pass
            self._release([])  # retry what was leased elsewhere
        elif kind == "resync":
            self._resync()

    def _release(self, keys: list[bytes]) -> None:
        """Hand blocks back to the pool unless another instance keeps them alive (leased):
        those are retried on later passes for RELEASE_RETRY_S, then left to the pool's own
        eviction. A block known here again (re-stored, re-read) is no longer ours to release."""
        now = time.monotonic()
        with self._lock:
            for k in keys:
                self._releasing[k] = now + RELEASE_RETRY_S
            todo = [k for k, deadline in self._releasing.items()
                    if deadline > now and k not in self._entries]
            self._releasing = {k: self._releasing[k] for k in todo}
        if not todo:
            return
        try:
            done = self._call(self.backend.release, [self.pool_key(k) for k in todo])
        except Unavailable:
            return
        with self._lock:
            for k, outcome in zip(todo, done):
                if outcome is not None:
                    self._releasing.pop(k, None)
                    self.counters.num_released += int(outcome)
                else:
                    self.counters.num_release_leased += 1

    def _do_puts(self, puts: list[tuple[bytes, torch.Tensor, PoolEntry, _PutBatch]]) -> None:
        results = [False] * len(puts)
        try:
            there = self._call(self.backend.exists, [e.pkey for _, _, e, _ in puts])
            todo = [i for i, ok in enumerate(there) if not ok]
            with self._lock:  # the owned count changes under the lock, as in put and _pop
                for i, ok in enumerate(there):
                    if ok:  # content key: someone stored this very block already
                        results[i] = True
                        if puts[i][2].owned and self._entries.get(puts[i][0]) is puts[i][2]:
                            self._num_owned -= 1
                        puts[i][2].owned = False
            if todo:
                blobs = self._frames([(puts[i][0], puts[i][1]) for i in todo])
                stored = self._call(self.backend.put, [puts[i][2].pkey for i in todo],
                                    blobs)
                for i, ok in zip(todo, stored):
                    results[i] = ok
        except Unavailable:
            pass
        finished: list[_PutBatch] = []
        with self._lock:
            self.counters.num_put_calls += 1
            for (key, _, entry, batch), ok in zip(puts, results):
                if ok and not entry.owned:
                    self.counters.num_dedup += 1
                elif ok:
                    self._stats.num_puts += 1
                    self.counters.bytes_put += self.frame_nbytes
                else:
                    self._stats.num_put_failed += 1
                    if self._entries.get(key) is entry:
                        self._pop(key)
                entry.stored = ok
                batch.ok = batch.ok and ok
                batch.left -= 1
                if not batch.left:
                    finished.append(batch)
            self.counters.peak_bytes = max(self.counters.peak_bytes, self._bytes_used())
        for batch in finished:  # after the outcome is recorded (whoever sees it resolve sees that)
            batch.write.set_result(batch.ok)

    def _do_gets(self, gets: list[tuple[bytes, torch.Tensor, Future]]) -> None:
        blobs = [torch.empty(self.frame_nbytes, dtype=torch.uint8) for _ in gets]
        try:
            got = self._call(self.backend.get, [self.pool_key(k) for k, _, _ in gets], blobs)
        except Unavailable:
            got = [False] * len(gets)
        results = [ok and self._unframe(k, blob, dst)
                   for (k, dst, _), ok, blob in zip(gets, got, blobs)]
        with self._lock:
            self.counters.num_get_calls += 1
            for (key, _, _), ok in zip(gets, results):
                entry = self._entries.get(key)
                if ok:
                    self._stats.num_hits += 1
                    self.counters.bytes_got += self.frame_nbytes
                    if entry is None or not entry.owned:
                        self.counters.num_remote_hits += 1
                    if entry is None and len(self._entries) < self.capacity_blocks:
                        # known from now on (not owned): this instance's keep-alive covers it
                        self._entries[key] = PoolEntry(self._tick(), resolved(True), owned=False,
                                                       pkey=self.pool_key(key))
                else:
                    self._stats.num_misses += 1
                    if entry is not None and entry.ready and not self.breaker.is_open:
                        self._pop(key)  # gone from the pool (evicted there, restarted)
        for (_, _, fut), ok in zip(gets, results):
            fut.set_result(ok)

    def _resync(self) -> None:
        """After an outage: forget known blocks the pool no longer has."""
        with self._lock:
            keys = [k for k, e in self._entries.items() if e.ready]
        if not keys:
            return
        try:
            there = self._call(self.backend.exists, [self.pool_key(k) for k in keys])
        except Unavailable:
            return
        with self._lock:
            for k, ok in zip(keys, there):
                if not ok and (e := self._entries.get(k)) is not None and e.ready:
                    self._pop(k)
