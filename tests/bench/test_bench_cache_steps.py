"""`bench cache`'s step loop on a small world: every step is timed, and its engine-thread context
switches (preempted by the OS / blocked on the GIL or a lock) are counted per step, so the bench
can say what its wall p99 is made of (`steps_preempted`, `steps_blocked` beside `step_cpu_ms_p99`)."""

from __future__ import annotations

import gc
import threading

from hintkv.bench.cache_steps import StepLoop
from hintkv.bench.cache_world import World


def test_each_step_counts_the_engine_threads_context_switches() -> None:
    gaps = [[2.0, 5.0, 1.0, 8.0, 3.0], [4.0, 1.5, 6.0]]
    w = World("sam", 4096, 12, 0, gaps)
    with w.running():
        loop = StepLoop(w)
        for _ in range(5):
            loop.step()
        # a step that waits for another thread holding a lock blocks: a voluntary switch
        lock = threading.Lock()
        lock.acquire()
        threading.Timer(0.05, lock.release).start()
        w.sam.on_step = lambda now, step=w.sam.on_step: (lock.acquire(), step(now))
        loop.step()
        loop.close()
    assert len(loop.switches) == len(loop.step_ms) == 6
    assert all(vol >= 0 and inv >= 0 for vol, inv in loop.switches)
    assert loop.switches[-1][0] >= 1, "a step that blocked on a lock counts no voluntary switch"
    w.kv.tiers.close()


def test_steps_leave_no_cyclic_garbage() -> None:
    """Loads, their futures and gathers are freed by reference counting: nothing a step leaves
    waits for the cyclic collector (a staging tensor among it), whatever its thresholds."""
    gaps = [[2.0, 5.0, 1.0, 8.0, 3.0], [4.0, 1.5, 6.0]]
    w = World("sam", 4096, 12, 0, gaps)
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with w.running():
            loop = StepLoop(w)
            loop.step()
            gc.collect()  # what building the loop left
            c = w.kv.tiers.counters
            loaded = c.num_loaded + c.num_prefetched
            for _ in range(20):
                loop.step()
            w.stack.flush()
            garbage = gc.collect()
            loaded = c.num_loaded + c.num_prefetched - loaded
        loop.close()
    finally:
        if was_enabled:
            gc.enable()
        w.kv.tiers.close()
    assert loaded > 0  # the steps resumed sessions from the host tier
    assert garbage == 0, f"{garbage} objects in reference cycles after 20 steps"
