"""The virtual mover: the tiers' real bookkeeping, with copies that take simulated time.

    mover = VirtualMover(clock, costs, real_block_bytes)
    host = HostTier(layout, capacity_bytes, mover=mover)   # the real tier, its real index

`HostTier`, `DiskTier` and `TierStack` hand every transfer to a `Mover` (`run` / `copy`). This one
runs none on a thread: each transfer is queued on its link ("device->host", "host->device", ...)
and completes on the event clock when the link, busy one transfer at a time, has moved the
block's REAL bytes (the profile's KV bytes per block, not the small payload the simulator keeps):

    start = max(now, link free, the unit's previous I/O done);  done = start + bytes / bandwidth
    (+ the link's latency when it was idle: a burst of block copies pays it once)

At `done` the (tiny) payload copy runs and the future resolves, so the tiers' own callbacks fire
in simulated time, in a deterministic order. Copies run beside the forward passes, as the
calibration shows they do on an H200 (a reload hides behind a prefill on a second stream).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures._base import PENDING

import torch

from hintkv.sim.clock import EventClock
from hintkv.sim.costs import CostModel
from hintkv.tiers.mover import SKIPPED, Mover, MoverStats

_SHARED = threading.Condition()  # the simulation is one thread: nothing ever waits on it


class _SimFuture(Future):
    """A `Future` without its own `threading.Condition`: at full scale a reload is thousands of
    block copies; building a Condition per Future was 36% of the simulator's time (py-spy, 4 users,
    host tier); this removes the mover's share (the tiers' own index builds the others)."""

    def __init__(self) -> None:
        self._condition = _SHARED
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks = []


class VirtualMover(Mover):
    def __init__(self, clock: EventClock, costs: CostModel, real_block_bytes: int) -> None:
        # No thread pool, no CUDA stream: everything happens on the event clock.
        self._clock = clock
        self._costs = costs
        self._block_bytes = real_block_bytes
        self._free_at: dict[str, float] = defaultdict(float)
        self._bytes: dict[str, int] = defaultdict(int)  # real bytes moved per direction
        self._blocks: dict[str, int] = defaultdict(int)
        self._num_failed = 0
        self._num_waits = 0
        self._wait_s = 0.0
        self._closed = False
        self._stream = None

    @property
    def pin_memory(self) -> bool:
        return False

    def staging(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def transfer_s(self, direction: str, num_blocks: int, idle: bool) -> float:
        src, dst = direction.split("->")
        link = self._costs.profile.link(src, dst)
        nbytes = num_blocks * self._block_bytes
        return (nbytes / (link.gbps * 1e9)) + (link.latency_ms / 1e3 if idle else 0.0)

    def book(self, direction: str, num_blocks: int) -> float:
        """Reserve the link for one batched call of `num_blocks` (each call pays the link's
        latency: a round trip, as a pool's get / put is); returns when it completes."""
        now = self._clock()
        done = max(now, self._free_at[direction]) + self.transfer_s(direction, num_blocks, idle=True)
        if num_blocks:
            self._free_at[direction] = done
            self._bytes[direction] += num_blocks * self._block_bytes
            self._blocks[direction] += num_blocks
        return done

    def run(self, direction: str | None, fn: Callable[[], bool], num_blocks: int, nbytes: int,
            after: Future | None = None) -> Future[bool]:
        out: Future[bool] = _SimFuture()

        def finish() -> None:
            try:
                done = fn()
            except Exception:  # noqa: BLE001 - as the real mover: a failed transfer is a miss
                done = False
            ok = done is not SKIPPED and bool(done)
            if direction is not None and done is not SKIPPED:
                if ok:
                    self._bytes[direction] += num_blocks * self._block_bytes
                    self._blocks[direction] += num_blocks
                else:
                    self._num_failed += 1
            out.set_result(ok)

        def launch(_: Future | None = None) -> None:
            now = self._clock()
            if direction is None:  # housekeeping (a file removal): no link time
                self._clock.at(now, finish, self)
                return
            free = self._free_at[direction]
            start = max(now, free)
            done = start + self.transfer_s(direction, num_blocks, idle=free <= now)
            self._free_at[direction] = done
            self._clock.at(done, finish, self)

        if after is None or after.done():
            launch()
        else:
            after.add_done_callback(launch)
        return out

    def copy(self, direction: str, dst: torch.Tensor, src: torch.Tensor, num_blocks: int = 1,
             after: Future | None = None) -> Future[bool]:
        def fn() -> bool:
            dst.copy_(src)
            return True

        return self.run(direction, fn, num_blocks, 0, after)

    def wait_done(self, future: Future, timeout_s: float) -> bool:
        """Block in simulated time: the clock runs its events (these copies, the agents' calls,
        the other instances' steps) until `future` is done or `timeout_s` has passed; asked inside
        another instance's wait, it does not wait (`EventClock.wait_for`)."""
        return self._clock.wait_for(future.done, self._clock() + timeout_s)

    def wait_loads(self, futures: Iterable[Future[bool]]) -> list[bool]:
        """Only ever asked for finished loads in a simulation (nothing can block)."""
        return [f.result(timeout=0) for f in futures]

    def stats(self) -> MoverStats:
        return MoverStats(dict(self._bytes), dict(self._blocks), self._num_failed, self._num_waits,
                          self._wait_s)

    def close(self) -> None:
        self._closed = True
