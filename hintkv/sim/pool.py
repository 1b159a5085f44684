"""The shared pool in the simulator: the REAL `PoolTier` (index, content keys, dedup, frames and
their MACs, session-aware victims, SPM's removals and keep-alives) over a real `EmbeddedBackend`
that every simulated instance shares, with its queued operations run on the event clock.

    meter = PoolMeter(real_block_bytes)
    backend = EmbeddedBackend(frame_nbytes)                       # one for the whole cluster
    tier = SimPoolTier(layout, backend, capacity_bytes, clock=clock, mover=mover, meter=meter, ...)

What differs from the live tier is only WHEN its queued operations run: instead of a worker thread
(and a thread pool with timeouts around each backend call), `_queue` collects the operations of
one event and runs them as the worker would (runs of one kind, one batched backend call each) at
the simulated time their transfer takes on the instance's NIC (`host->pool` for puts,
`pool->host` for gets, the link's latency for removals / releases / keep-alives), from the
profile. The blobs are real frames of the simulator's small payload (32 bytes + header), so every
read is checked as in production; times and byte figures use the profile's real block bytes.
"""

from __future__ import annotations

import threading

from hintkv.pool.embedded import EmbeddedBackend
from hintkv.sim.clock import EventClock
from hintkv.sim.mover import VirtualMover
from hintkv.tiers.disk_format import HEADER_SIZE
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.pool import PoolTier

_COST_LINK = {"put": "host->pool", "get": "pool->host"}


class PoolMeter:
    """The cluster's pool footprint over simulated time (blocks in the shared backend)."""

    def __init__(self, real_block_bytes: int) -> None:
        self.real_block_bytes = real_block_bytes
        self.peak_blocks = 0
        self.block_seconds = 0.0
        self._last_t = 0.0
        self._last = 0

    def sample(self, now: float, blocks: int) -> None:
        self.block_seconds += self._last * (now - self._last_t)
        self._last_t, self._last = now, blocks
        self.peak_blocks = max(self.peak_blocks, blocks)

    @property
    def peak_bytes(self) -> int:
        return self.peak_blocks * self.real_block_bytes

    def mean_bytes(self, until: float) -> float:
        return self.block_seconds / max(until, 1e-9) * self.real_block_bytes


class SimPoolTier(PoolTier):
    def __init__(self, *args, clock: EventClock, mover: VirtualMover, meter: PoolMeter,
                 **kwargs) -> None:
        self._sim_clock = clock
        self._sim_mover = mover
        self._meter = meter
        self._batch: list[tuple] = []
        super().__init__(*args, **kwargs)

    def _start_worker(self) -> threading.Thread | None:
        return None  # the event clock runs the queue

    def _call(self, fn, *args):
        result = fn(*args)  # in-process backend, simulated time: no timeout, no breaker trip
        self.breaker.success()
        return result

    def _queue(self, op: tuple) -> None:
        if not self._batch:
            self._sim_clock.after(0.0, self._drain, self._sim_mover)  # this event's ops: one pass
        self._batch.append(op)

    def _drain(self) -> None:
        ops, self._batch = self._batch, []
        start = 0
        while start < len(ops):  # runs of one kind, in arrival order (as the worker does)
            end = start
            while end < len(ops) and ops[end][0] == ops[start][0]:
                end += 1
            kind, run = ops[start][0], ops[start:end]
            blocks = len(run) if kind in _COST_LINK else 0
            done = self._sim_mover.book(_COST_LINK.get(kind, "host->pool"), blocks)
            self._sim_clock.at(done, lambda k=kind, r=run: self._finish(k, r), self._sim_mover)
            start = end

    def _finish(self, kind: str, ops: list[tuple]) -> None:
        self._process(kind, ops)
        used = self.backend.used_bytes()
        if used is not None:
            self._meter.sample(self._sim_clock(), used // self.backend.blob_nbytes)

    def flush(self) -> None:
        """Nothing to wait for: queued operations complete as the clock runs."""

    def close(self) -> None:
        self.backend.close()


class SimPool:
    """The cluster's one pool: a shared `EmbeddedBackend` (blobs in this process), a meter, and
    a `SimPoolTier` per instance (`capacity_blocks` each: what one instance may keep there).
    `policy`: "spm" (session-aware, SPM on when the engine takes hints) or "lru" (a plain store)."""

    def __init__(self, policy: str, capacity_blocks: int, real_block_bytes: int,
                 write_through: bool = False) -> None:
        if policy not in ("spm", "lru"):
            raise ValueError(f"pool policy must be spm or lru, not {policy!r}")
        self.policy = policy
        self.capacity_blocks = capacity_blocks
        self.write_through = write_through  # SPM's publish of each finished request
        self.meter = PoolMeter(real_block_bytes)
        self.backend: EmbeddedBackend | None = None
        self.tiers: list[SimPoolTier] = []

    def tier(self, layout: BlockLayout, clock: EventClock, mover: VirtualMover) -> SimPoolTier:
        frame = HEADER_SIZE + layout.nbytes
        if self.backend is None:
            self.backend = EmbeddedBackend(frame)
        t = SimPoolTier(layout, self.backend, self.capacity_blocks * frame,
                        session_aware=self.policy == "spm", clock=clock, mover=mover,
                        meter=self.meter, write_through=self.write_through)
        self.tiers.append(t)
        return t

    def stats(self) -> dict[str, int]:
        """Summed over instances: the pool tiers' counters."""
        out: dict[str, int] = {}
        for t in self.tiers:
            for k, v in t.pool_stats().items():
                if isinstance(v, int):
                    out[k] = out.get(k, 0) + v
        return out
