"""The serving process's garbage-collector setting: the start-up heap frozen, young collections rarer.

After start-up the process holds millions of long-lived objects (one `Block` per KV block: 68K
on an H200 with an 8B model, the host tier's index, the model's modules). CPython's cyclic
collector walks every tracked object in a full collection, so with them in the heap a full
collection on the engine thread costs milliseconds, inside some step. `gc.freeze()` moves
everything alive now into a permanent generation the collector never walks (vLLM does the same
after its engine starts); what the steps allocate is still collected.

The young generations are the other cost. With CPython's default thresholds (700, 10, 10) a
young collection starts every 700 net container allocations; a scheduler step with 256 running
sequences allocates that many in a few steps (host-tier entries, sequences whose token lists
the collector walks item by item, and, until they were broken, ~65 objects per step in
reference cycles: each load's future, its callback and the `PendingLoad` with its staging
tensor; each `gather`'s futures and callback), so a gen0 collection (~1.5 ms CPU, ~2K objects)
or a gen1 one (~19 ms, ~17K objects) fell inside 149 of 4,000 steps of `hintkv bench cache
--quick` (3.7%: above the p99 line). The pause grows with the young objects walked and the
number of pauses falls with the threshold, so a threshold of `SERVING_GEN0_THRESHOLD` puts a
collection in about one step in several hundred (off the p99 line). It stays a threshold: at
most that many young container objects wait for a collection and cyclic garbage is still
reclaimed; the steps' own objects no longer form cycles (`tests/bench/test_bench_cache_steps.py`),
so nothing large (a staging tensor) waits for it. The cost: one gen0 collection at this threshold
walks every live young object (55-85 ms CPU in `bench cache --quick` under load), about ten times
a run instead of ~1,000 small ones. The value is ours, from those counts; we found no vLLM or
SGLang source that sets a gen0 threshold (vLLM does freeze its start-up heap).

`hintkv serve` calls `tune_for_serving` once the engine is built (`server.launch.start_engine`);
`bench cache` measures its steps the same way.
"""

from __future__ import annotations

import gc

# young container allocations (net) between two gen0 collections while serving; gen1 / gen2
# keep CPython's ratios (a gen1 collection every 10 gen0, gen2 every 10 gen1 and only when the
# long-lived heap grew by 25%)
SERVING_GEN0_THRESHOLD = 50_000


def freeze_startup_heap() -> None:
    """Collect what start-up left behind, then freeze the survivors (call once, after start-up)."""
    gc.collect()
    gc.freeze()


def tune_for_serving() -> tuple[int, int, int]:
    """The serving setting: freeze the start-up heap, raise the gen0 threshold (collector stays
    on). Returns the thresholds it replaced (for `restore`)."""
    before = gc.get_threshold()
    freeze_startup_heap()
    gc.set_threshold(SERVING_GEN0_THRESHOLD, before[1], before[2])
    return before


def restore(thresholds: tuple[int, int, int]) -> None:
    """Undo `tune_for_serving` (benchmarks and tests): thresholds back, the frozen heap thawed."""
    gc.set_threshold(*thresholds)
    gc.unfreeze()
