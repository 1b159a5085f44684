"""The movement engine: runs block copies and disk I/O off the engine loop, and counts them.

On a CPU host it is a small thread pool (torch copies and file I/O release the GIL) whose threads run
their copies without OpenMP, so that the engine thread's OpenMP pool stays the process's only one. On CUDA,
tensor copies also go through a dedicated copy stream: the copy waits for the compute stream as
it was when the copy was asked for (so KV still being written is not read), runs with
`non_blocking=True` between pinned host memory and the device, and a worker waits on the copy's
event before resolving the future, so compute keeps running while blocks move.

Operations on the same storage (a host slot, a disk file) are ordered with `after=`: the new
operation starts only once the previous one has finished. The wait is a done-callback, never a
blocked worker, so chains of any length cannot starve the pool.

Counted per direction ("device->host", "host->disk", "disk->host", "host->device", ...): bytes
and blocks of successful transfers; plus the seconds callers spent blocked in `wait_loads`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import torch

from hintkv.openmp_env import serial_openmp_thread

log = logging.getLogger(__name__)


@dataclass(slots=True)
class MoverStats:
    bytes_moved: dict[str, int] = field(default_factory=dict)  # direction -> bytes
    blocks_moved: dict[str, int] = field(default_factory=dict)  # direction -> blocks
    num_failed: int = 0  # operations that resolved False (miss, I/O error, exception)
    num_load_waits: int = 0  # calls to wait_loads
    load_wait_s: float = 0.0  # seconds callers spent blocked in wait_loads

    def merged(self, other: MoverStats) -> MoverStats:
        out = MoverStats(dict(self.bytes_moved), dict(self.blocks_moved), self.num_failed
                         + other.num_failed, self.num_load_waits + other.num_load_waits,
                         self.load_wait_s + other.load_wait_s)
        for d, n in other.bytes_moved.items():
            out.bytes_moved[d] = out.bytes_moved.get(d, 0) + n
        for d, n in other.blocks_moved.items():
            out.blocks_moved[d] = out.blocks_moved.get(d, 0) + n
        return out


SKIPPED = "skipped"  # what a job returns when it had nothing to do (a cancelled hand-down):
# its future resolves False, and it is counted neither as moved nor as failed


def resolved(value: bool) -> Future[bool]:
    """A future that is already done with `value`."""
    f: Future[bool] = Future()
    f.set_result(value)
    return f


def gather(futures: list[Future[bool]]) -> Future[list[bool]]:
    """One future for many: their results in order, once every one is done. A future that
    appears many times (a batch shared by its blocks) is waited on once: a callback per block
    on one batch future was ~10% of a full-scale simulation (py-spy)."""
    out: Future[list[bool]] = Future()
    if not futures:
        out.set_result([])
        return out
    distinct = list({id(f): f for f in futures}.values())
    left = [len(distinct)]
    lock = threading.Lock()

    def one(_: Future) -> None:
        nonlocal futures, distinct
        with lock:
            left[0] -= 1
            last = not left[0]
        if last:  # each distinct future's result read once (`result()` takes its lock: a
            # 128-block load's two gathers held the GIL ~0.5 ms on the mover, inside a step)
            ok = {id(f): bool(f.result()) for f in distinct}
            result = list(map(ok.__getitem__, map(id, futures)))
            # every future keeps this callback, which kept them all: a cycle only the cyclic
            # collector would free (with what their results hold); done, it lets go of them
            futures = distinct = []
            out.set_result(result)

    for f in distinct:
        f.add_done_callback(one)
    return out


class Mover:
    """Thread pool (+ CUDA copy stream) that runs transfers and counts them per direction."""

    def __init__(self, num_workers: int = 2, use_cuda_stream: bool | None = None) -> None:
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        # its threads run no OpenMP region: a copy's region would start a second libgomp pool beside the
        # engine thread's, and libgomp then throttles every spin to 100 (openmp_env.serial_openmp_thread)
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="hintkv-mover",
                                        initializer=serial_openmp_thread)
        if use_cuda_stream is None:
            use_cuda_stream = torch.cuda.is_available()
        self._stream = torch.cuda.Stream() if use_cuda_stream else None
        self._lock = threading.Lock()
        self._bytes: dict[str, int] = defaultdict(int)
        self._blocks: dict[str, int] = defaultdict(int)
        self._num_failed = 0
        self._num_waits = 0
        self._wait_s = 0.0
        self._closed = False

    @property
    def copy_stream(self) -> torch.cuda.Stream | None:
        """The CUDA copy stream (None on a CPU host)."""
        return self._stream

    @property
    def pin_memory(self) -> bool:
        """Whether host buffers should be pinned (only meaningful with a CUDA copy stream)."""
        return self._stream is not None

    def staging(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host buffer for one transfer (pinned when copies go to a CUDA device)."""
        return torch.empty(shape, dtype=dtype, pin_memory=self.pin_memory)

    def run(self, direction: str | None, fn: Callable[[], bool], num_blocks: int, nbytes: int,
            after: Future | None = None) -> Future[bool]:
        """Run `fn` on the pool once `after` (if any) is done; count it under `direction` if it
        returns True, as failed if False (direction None: housekeeping, not a transfer, never
        counted; `SKIPPED`: nothing done, not counted, resolves False)."""
        out: Future[bool] = Future()

        def work() -> None:
            try:
                done = fn()
            except Exception:
                log.exception("transfer %s failed", direction)
                done = False
            ok = done is not SKIPPED and bool(done)
            if done is not SKIPPED:
                self._count(direction, ok, num_blocks, nbytes)
            out.set_result(ok)

        def launch(_: Future | None = None) -> None:
            try:
                self._pool.submit(work)
            except RuntimeError:  # pool shut down: the transfer simply does not happen
                self._count(direction, False, num_blocks, nbytes)
                out.set_result(False)

        if after is None:
            launch()
        else:
            after.add_done_callback(launch)
        return out

    def copy(self, direction: str, dst: torch.Tensor, src: torch.Tensor, num_blocks: int = 1,
             after: Future | None = None) -> Future[bool]:
        """Copy `src` into `dst` (same shape) off the caller's thread; CUDA copies use the copy
        stream, ordered after the compute stream's work queued so far."""
        ready = None
        if self._stream is not None and (dst.is_cuda or src.is_cuda):
            ready = torch.cuda.Event()
            ready.record()  # the compute stream, now: the copy must not overtake it

        def fn() -> bool:
            if ready is None:
                dst.copy_(src)
                return True
            assert self._stream is not None
            with torch.cuda.stream(self._stream):
                self._stream.wait_event(ready)
                dst.copy_(src, non_blocking=True)
                for t in (dst, src):
                    if t.is_cuda:  # keep the caching allocator from reusing it mid-copy
                        t.record_stream(self._stream)
                done = torch.cuda.Event()
                done.record(self._stream)
            done.synchronize()
            return True

        return self.run(direction, fn, num_blocks, dst.numel() * dst.element_size(), after)

    def wait_done(self, future: Future, timeout_s: float) -> bool:
        """Block until `future` is done or `timeout_s` passes (a step waiting for its load:
        `TierConnector.wait_load`); True: done. The simulator's mover waits in simulated time."""
        wait([future], timeout=timeout_s)
        return future.done()

    def wait_loads(self, futures: Iterable[Future[bool]]) -> list[bool]:
        """Block until the loads are done; the time spent blocked is counted as load wait."""
        t0 = time.perf_counter()
        results = [f.result() for f in futures]
        with self._lock:
            self._num_waits += 1
            self._wait_s += time.perf_counter() - t0
        return results

    def stats(self) -> MoverStats:
        with self._lock:
            return MoverStats(dict(self._bytes), dict(self._blocks), self._num_failed,
                              self._num_waits, self._wait_s)

    def close(self) -> None:
        """Finish queued transfers, then stop the workers. Idempotent."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True)

    def _count(self, direction: str | None, ok: bool, num_blocks: int, nbytes: int) -> None:
        if direction is None:
            return
        with self._lock:
            if ok:
                self._bytes[direction] += nbytes
                self._blocks[direction] += num_blocks
            else:
                self._num_failed += 1
