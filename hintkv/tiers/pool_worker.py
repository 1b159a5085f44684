"""The pool tier's I/O: the op queue, its worker, batched backend calls with timeouts.

    put / get / remove / keep_alive ──▶ op queue ──▶ worker: consecutive ops of one kind become
                                                    ONE batched backend call (timeout + breaker)

`PoolWorker` is the I/O half of `tiers.pool.PoolTier` (which owns the index and every decision
about it): it runs what the tier queued on one worker thread (the simulator's `SimPoolTier` runs
the queue on its event clock instead: `_start_worker`, `_queue`) and records each outcome in the
tier's index under the tier's lock.
Every backend call has a timeout; failures open a `CircuitBreaker`, and while it is
open every call is a miss / refused put at once (serving goes on from the local tiers). When
a probe succeeds the tier re-checks its index against the pool (a restarted master holds
nothing) and goes on by itself.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from collections.abc import Iterable
from itertools import chain

import torch

from hintkv.openmp_env import serial_openmp_thread
from hintkv.pool.backend import BackendError
from hintkv.tiers.mover import resolved
from hintkv.tiers.pool_entries import PoolEntry, PutBatch, Unavailable

log = logging.getLogger("hintkv.tiers.pool")

RELEASE_RETRY_S = 30.0  # how long a leased block's release is retried
CLOSE_WAIT_S = 30.0  # close() waits this long for a hanging backend call to return


class PoolWorker:
    """Mixin of `PoolTier`: uses the tier's `_lock`, `_entries`, `_stats`, `counters`, its queue
    (`_ops`, `_cv`, `_busy`, `_closing`) and call pool (`_calls`, `_calls_cv`)."""

    def _start_worker(self) -> threading.Thread | None:
        """The thread that runs queued ops (the simulator runs them on its event clock instead)."""
        worker = threading.Thread(target=self._run_serial, name="pool-worker", daemon=True)
        worker.start()
        return worker

    def flush(self) -> None:
        with self._cv:
            while self._ops or self._busy:
                self._cv.wait()

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

    # -- the worker -------------------------------------------------------------------------
    def _queue(self, op: tuple) -> None:
        with self._cv:
            self._ops.append(op)
            self._cv.notify_all()

    def _run_serial(self) -> None:
        """`_run` with its frames' copies off OpenMP: no second libgomp pool beside the engine thread's."""
        serial_openmp_thread()
        self._run()

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
        elif kind == "retry":
            self._release([])
        elif kind == "keep":
            # each op's keys are distinct (`keep_alive`): only several need merging
            keys = (ops[0][1] if len(ops) == 1
                    else list(dict.fromkeys(chain.from_iterable(op[1] for op in ops))))
            try:
                found = self._call(self.backend.keep_alive, keys)
                with self._lock:
                    self.counters.num_keepalive_calls += 1
                    self.counters.num_keepalive_keys += len(keys)
                    head = len(self._key_head)  # a pool key is the head, then the block's hash in hex
                    self._forget_lost([bytes.fromhex(pk[head:]) for pk, ok in zip(keys, found) if not ok],
                                      "keep-alive")
            except Unavailable:
                pass
            self._release([])  # retry what was leased elsewhere
        elif kind == "resync":
            self._resync()

    def _release(self, keys: list[bytes]) -> None:
        """Hand blocks back to the pool unless another instance keeps them alive (leased):
        those are retried on later passes for RELEASE_RETRY_S, then left to the pool's own
        eviction. A block known here again (re-stored, re-read) is no longer ours to release; one
        whose re-store by this instance is still queued (a capacity victim that came back) stays
        listed without a call, so that put finds the pool's copy ours (`_do_puts`)."""
        now = time.monotonic()
        with self._lock:
            for k in keys:
                self._releasing[k] = now + RELEASE_RETRY_S
            listed, todo = {}, []
            for k, deadline in self._releasing.items():
                e = self._entries.get(k)
                if deadline <= now or (e is not None and (e.stored or not e.owned)):
                    continue
                listed[k] = deadline
                if e is None:
                    todo.append(k)
            self._releasing = listed
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

    def _do_puts(self, puts: list[tuple[bytes, torch.Tensor, PoolEntry, PutBatch]]) -> None:
        results = [False] * len(puts)
        kept: set[int] = set()  # ours in the pool already: handed back, not released yet
        try:
            there = self._call(self.backend.exists, [e.pkey for _, _, e, _ in puts])
            todo = [i for i, ok in enumerate(there) if not ok]
            with self._lock:  # the owned count changes under the lock, as in put and _pop
                for i, ok in enumerate(there):
                    if ok:  # content key: someone stored this very block already
                        results[i] = True
                        if self._releasing.pop(puts[i][0], None) is not None:
                            kept.add(i)  # we did, and handed it back: not released yet, so still ours
                            continue
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
        finished: list[PutBatch] = []
        with self._lock:
            self.counters.num_put_calls += 1
            for i, ((key, _, entry, batch), ok) in enumerate(zip(puts, results)):
                if ok and (not entry.owned or i in kept):
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
            reached = True
        except Unavailable:
            got, reached = [False] * len(gets), False
        results = [ok and self._unframe(k, blob, dst)
                   for (k, dst, _), ok, blob in zip(gets, got, blobs)]
        with self._lock:
            self.counters.num_get_calls += 1
            gone = []  # the blocks the pool did not have
            for (key, _, _), ok, there in zip(gets, results, got):
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
                        if reached and not there and entry.owned:  # gone from the pool (restarted)
                            gone.append(key)
                        else:  # evicted there, a torn or foreign blob: forgotten, so written again
                            self._pop(key)
            self._forget_lost(gone, "a read")
        for (_, _, fut), ok in zip(gets, results):
            fut.set_result(ok)

    def _forget_lost(self, keys: Iterable[bytes], found_by: str) -> None:
        """Forget the blocks this instance stored that a call found gone from the pool (a master restarted
        between calls: none failed, so the breaker never re-checked), so their next write-through puts them
        again (`num_lost`). Only stored (ready) entries: a put still queued is not lost. Under the tier lock."""
        lost = 0
        for key in keys:
            if (e := self._entries.get(key)) is not None and e.owned and e.ready:
                self._pop(key)
                lost += 1
        if lost:
            self.counters.num_lost += lost
            log.warning("pool: %s found %d blocks this instance stored gone from the pool (restarted?): "
                        "forgotten, written again at their next write-through", found_by, lost)

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
