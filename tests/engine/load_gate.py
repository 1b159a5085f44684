"""A held-up host load for the same-step lock tests: the mover's workers are kept busy by real
mover jobs that wait on an event, so a load queued behind them lands only once it is set."""

from __future__ import annotations

import threading

from hintkv.tiers.mover import Mover

WORKERS = 2  # Mover's default pool size (hintkv.tiers.mover)


class MoverGate:
    def __init__(self, mover: Mover, workers: int = WORKERS) -> None:
        self.open = threading.Event()
        busy = threading.Semaphore(0)

        def hold() -> bool:
            busy.release()
            return self.open.wait(300)
        self.jobs = [mover.run(None, hold, 0, 0) for _ in range(workers)]
        for _ in range(workers):  # every worker is now inside `hold`
            assert busy.acquire(timeout=60), "the mover's workers never started the gate's jobs"

    def release(self) -> None:
        self.open.set()
        for j in self.jobs:
            j.result(timeout=60)


def slow_but_worth_loading(tiers, tier: str = "host") -> None:
    """Costs under which a one-block load is expected to take 100 s and recomputing a block far
    longer: same-step waits for the load (idle step: up to 3 expected copies) instead of giving up
    on it, so only the gate decides when it lands."""
    tiers.costs.prefill_s_per_token = 1000.0
    tiers.costs.bandwidth[tier] = tiers.layout.nbytes / 100.0
