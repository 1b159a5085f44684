"""`hintkv bench cache`: the cache core alone at real sizes (no model), `sam` against `lru`.

    python -m hintkv bench cache [--quick]

One "world" per (policy, device pool, live sessions): a real `KVCacheManager` + `SessionRegistry`
+ SAM + `TierConnector` over a real host tier of 10x the device pool (a tiny block payload, 64
bytes: what is measured is bookkeeping, not copies). Every live session holds a 2K-token context
(a 1K-token system prompt shared by all + 1K of its own); the contexts are placed on the device
and written down to host as the pool fills, so the device is full of cached blocks and every
admission evicts. Each session has a history: it replays a window of one real agent's recorded
gaps between calls (`bench.trace_gaps`, both trace families alternately) on the world's clock,
so SAM's gap estimates and predicted returns are what a real agent would give, and it sits at a
random point of its next recorded gap when the measurement starts. Then, per operation, the
latency of single calls (median, p99):

    match          match_prefix of a session's context (hashes precomputed, as the engine does)
    admit          can_admit + admit of a 4-block prompt (evicts 4 cached blocks: full pool)
    append         can_append + append of one decode token
    commit         commit after one computed token
    free           free of a finished 2K-token sequence
    arrive / done  a session's request arrives / ends (its 128 blocks change class)
    victims        choose_victims(16)
    tier_put       TierStack.store of one block (the caller's cost; the copy runs on the mover)
    tier_lookup    TierStack.lookup of a 128-block context

and the bookkeeping of one scheduler step with 256 running sequences: per step every running
sequence appends and commits one token (one pass each: `append_many`, `commit_many`), one finishes (free + session done), the session whose
recorded next call is due first resumes (arrival, prefix match across device and host,
admission, its load landing later), SAM's per-step re-ranking and predicted prefetches (within
its per-step budget) and the connector's poll. Each part is timed on its own too (`parts`), and
the collector's pauses that fell inside the step (`gc`, from `gc.callbacks`). The
write-down flush (outside the state lock, before the forward pass) is timed separately. Next to
the step's wall time, the engine thread's CPU time (`step_cpu_ms_*`): a wall p99 far above the
CPU p99 is time spent waiting (other processes on a loaded machine, the GIL held by a mover);
and its context switches: `steps_preempted` (the OS took the core away), `steps_blocked` (it
waited for the GIL or a lock: another process's, or one of our own movers'). The work alone is
`step_cpu_ms_p99`; a wall p99 of only the steps that were never switched out would be biased low
(a long step is the likeliest to be preempted, so the filter drops the steps a p99 is about).

How it is measured: the worlds of one session count (lru and sam at every pool size) are built
first, then measured interleaved: round r takes one sample of every world's operations, in an
order rotating with r, then the steps the same way (`measure`), so drift of a shared machine
hits every world alike and each ratio compares calls made side by side in time. A world's clock
stands still while the others run. 300 samples of each operation and 1000 steps per world (the
p99 is the 10th-worst step). As `serve` runs: the start-up heap is frozen
and the young threshold raised (`engine.gc_tuning`), the collector stays on (its pauses count:
`steps_with_gc` counts the steps with a collection inside); between steps, where the
forward pass runs, the bench waits for the mover's copies (untimed), as the forward would.

Goals (issue 7): step bookkeeping at 1M device + 10M host tokens, 1000 sessions, 256 running
< 1 ms median and < 5 ms p99; each operation's median flat within 2x from 10K to 1M tokens;
`sam` within 1.5x of `lru` per operation.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from itertools import zip_longest
from typing import Self

from hintkv.bench.cache_steps import StepLoop
from hintkv.bench.cache_world import (
    BS,
    HOST_FACTOR,
    OPS,
    OWN_BLOCKS,
    PARTS,
    SYSTEM_BLOCKS,
    World,
    ops_once,
)
from hintkv.bench.common import (
    add_common_args,
    emit_json,
    goal,
    log,
    median,
    percentile,
    print_table,
)
from hintkv.bench.trace_gaps import DEFAULT_TRACES, trace_gaps
from hintkv.engine.gc_tuning import restore, tune_for_serving


def _rotated(xs: list, r: int) -> list:
    """`xs` starting at position r (mod its length): each one leads equally often."""
    k = r % len(xs)
    return xs[k:] + xs[:k]


def reference_loop() -> float:
    """Microseconds of a fixed pure-Python workload (dict reads and writes, as bookkeeping does):
    how fast this machine runs such code at this moment. Timed in every round of steps beside
    the worlds, so a slow run says whether the machine was slow (every part of a step slower
    alike) or the code was."""
    t0 = time.perf_counter_ns()
    d: dict[int, int] = {}
    for i in range(3000):
        d[i & 511] = d.get(i & 511, 0) + i
    return (time.perf_counter_ns() - t0) / 1e3


class GcPauses:
    """Collections and their total pause while installed (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.num, self.ms, self._t0 = 0, 0.0, 0
        self.by_generation: dict[int, list[float]] = {}  # generation -> [collections, ms]

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        else:
            ms = (time.perf_counter_ns() - self._t0) / 1e6
            self.num += 1
            self.ms += ms
            n_ms = self.by_generation.setdefault(info["generation"], [0, 0.0])
            n_ms[0] += 1
            n_ms[1] += ms

    def __enter__(self) -> Self:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)


def measure(worlds: list[World], samples: int, steps: int, reference: list[float] | None = None,
            pauses: GcPauses | None = None) -> tuple[list[dict[str, list[float]]], list[StepLoop]]:
    """Interleaved, so that drift of a shared machine hits every world alike: round r runs one
    sample of each world's operations (in an order rotating with r), then the same for steps
    (and one `reference_loop` into `reference`). A world's clock runs only while it is measured
    (`World.running`)."""
    ops: list[dict[str, list[float]]] = [{op: [] for op in OPS} for _ in worlds]
    order = list(range(len(worlds)))
    for r in range(samples):
        for k in _rotated(order, r):
            with worlds[k].running():
                ops_once(worlds[k], ops[k])
    loops = []
    for w in worlds:
        w.stack.flush()
        with w.running():
            loops.append(StepLoop(w, (lambda: pauses.ms) if pauses is not None else None))
    for r in range(steps):
        for k in _rotated(order, r):
            with worlds[k].running():
                loops[k].step()
        if reference is not None:
            reference.append(reference_loop())
    for loop in loops:
        loop.close()
    return ops, loops


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hintkv bench cache", description=__doc__.split("\n")[0])
    add_common_args(p)
    p.add_argument("--traces", default=str(DEFAULT_TRACES),
                   help="folder with claude-code/ and swe-agent/: the sessions' gap histories")
    args = p.parse_args(argv)
    families = trace_gaps(args.traces)
    gaps = [g for pair in zip_longest(*families.values()) for g in pair if g]  # alternately
    if not gaps:
        p.error(f"no agent traces with gaps under {args.traces}")
    log("gap histories: " + ", ".join(f"{k} {len(v)} agents" for k, v in families.items()))
    load_before = os.getloadavg()[0]
    sizes = [10_000, 1_000_000] if args.quick else [10_000, 100_000, 1_000_000]
    session_counts = [1000] if args.quick else [10, 100, 1000]
    samples, steps = 300, 1000  # per world, interleaved: p99 of 1000 steps is the 10th-worst
    rows, results = [], {}
    reference: list[float] = []  # the machine's speed, once per round of steps
    pauses = GcPauses()
    for n_sessions in session_counts:
        worlds, keys = [], []
        for tokens in sizes:
            for policy in ("lru", "sam"):
                t0 = time.perf_counter()
                worlds.append(World(policy, tokens, n_sessions, args.seed, gaps))
                worlds[-1].setup_s = time.perf_counter() - t0
                keys.append((policy, tokens, n_sessions))
        # as `serve` runs (`engine.gc_tuning.tune_for_serving`): the start-up heap frozen, the
        # serving thresholds, the collector on while measuring (its pauses are part of a step)
        gc_default = tune_for_serving()
        gc0 = sum(st["collections"] for st in gc.get_stats())
        with pauses:
            ops, loops = measure(worlds, samples, steps, reference, pauses)
        n_gc = sum(st["collections"] for st in gc.get_stats()) - gc0
        gc_serving = gc.get_threshold()
        restore(gc_default)
        for (policy, tokens, _), w, op_xs, loop in zip(keys, worlds, ops, loops):
            parts = loop.parts
            row = {"policy": policy, "device_tokens": tokens,
                   "host_tokens": HOST_FACTOR * tokens, "sessions": n_sessions,
                   "running": loop.running_target, "host_fill": round(w.host_fill, 3),
                   "steps": len(loop.step_ms), "samples": samples,
                   "step_ms_p50": median(loop.step_ms),
                   "step_ms_p99": percentile(loop.step_ms, 99),
                   "step_cpu_ms_p50": median(parts["cpu"]),
                   "step_cpu_ms_p99": percentile(parts["cpu"], 99),
                   # the steps the OS preempted / that blocked (GIL, a lock)
                   "steps_preempted": sum(1 for _, inv in loop.switches if inv),
                   "steps_blocked": sum(1 for vol, _ in loop.switches if vol),
                   # the steps with a collection inside (any thread's: a mover's holds the GIL)
                   "steps_with_gc": sum(1 for x in parts["gc"] if x > 0),
                   "flush_ms_p50": median(loop.flush_ms), "setup_s": w.setup_s,
                   "gc_collections": n_gc,
                   "predicted_prefetches": w.sam.num_predicted_prefetches}
            for part, xs in parts.items():
                row[f"{part}_ms"] = median(xs)
                row[f"{part}_ms_p99"] = percentile(xs, 99)
            for op, xs in op_xs.items():
                row[f"{op}_us"] = median(xs) if xs else None
                row[f"{op}_us_p99"] = percentile(xs, 99) if xs else None
            rows.append(row)
            results[(policy, tokens, n_sessions)] = row
            log(f"{policy} {tokens} tokens {n_sessions} sessions: step "
                f"{row['step_ms_p50']:.3f} ms p50, setup {w.setup_s:.1f}s")
            w.kv.tiers.close()
    print_table(rows, ["policy", "device_tokens", "sessions", "running", "host_fill",
                       "step_ms_p50", "step_ms_p99", "step_cpu_ms_p99",
                       "steps_preempted", "steps_blocked", "steps_with_gc", "flush_ms_p50"]
                + [f"{op}_us" for op in OPS])
    print()
    print("one step, part by part (ms, median / p99):")
    print_table(rows, ["policy", "device_tokens", "sessions", "predicted_prefetches"]
                + [f"{part}_ms{q}" for part in [*PARTS, "gc"] for q in ("", "_p99")])
    machine = {"reference_loop_us_p10": percentile(reference, 10),
               "reference_loop_us_p50": median(reference),
               "reference_loop_us_p90": percentile(reference, 90),
               "gc_thresholds": gc_serving, "gc_collections": pauses.num, "gc_pause_ms_total": round(pauses.ms, 2),
               "gc_by_generation": {g: {"collections": n, "ms": round(ms, 2)}
                                    for g, (n, ms) in sorted(pauses.by_generation.items())}}
    print()
    print("the machine meanwhile: a fixed pure-Python loop (reference_loop, once per round of steps)"
          f" {machine['reference_loop_us_p50']:.1f} us median ({machine['reference_loop_us_p10']:.1f}"
          f" p10, {machine['reference_loop_us_p90']:.1f} p90); {pauses.num} collections,"
          f" {pauses.ms:.1f} ms of pauses in all ("
          + ", ".join(f"gen{g} {v['collections']} / {v['ms']:.1f} ms"
                      for g, v in machine["gc_by_generation"].items()) + ")")
    big, small, most = max(sizes), min(sizes), max(session_counts)
    key_row = results[("sam", big, most)]
    flat = {f"{pol}:{op}": results[(pol, big, most)][f"{op}_us"] / results[(pol, small, most)][f"{op}_us"]
            for pol in ("lru", "sam") for op in OPS
            if results[(pol, big, most)][f"{op}_us"] and results[(pol, small, most)][f"{op}_us"]}
    vs_lru = {f"{tokens}/{n}:{op}": results[("sam", tokens, n)][f"{op}_us"]
              / results[("lru", tokens, n)][f"{op}_us"]
              for tokens in sizes for n in session_counts for op in OPS
              if results[("sam", tokens, n)][f"{op}_us"] and results[("lru", tokens, n)][f"{op}_us"]}
    # samples interleaved (`measure`): a ratio compares calls made side by side in time
    worst_flat = max(flat, key=flat.get)
    worst_vs = max(vs_lru, key=vs_lru.get)
    goals = {
        "step_bookkeeping_median_ms": goal(1.0, key_row["step_ms_p50"], key_row["step_ms_p50"] < 1.0),
        "step_bookkeeping_p99_ms": goal(5.0, key_row["step_ms_p99"], key_row["step_ms_p99"] < 5.0),
        "op_flat_10k_to_1m_max_ratio": goal(2.0, flat[worst_flat], flat[worst_flat] <= 2.0),
        "sam_vs_lru_max_ratio": goal(1.5, vs_lru[worst_vs], vs_lru[worst_vs] <= 1.5),
    }
    emit_json({"bench": "cache", "quick": args.quick, "block_size": BS,
               "context_tokens": (SYSTEM_BLOCKS + OWN_BLOCKS) * BS, "worst_flat": worst_flat,
               "worst_sam_vs_lru": worst_vs, "flat_ratios": flat, "sam_vs_lru": vs_lru,
               "load_avg_1m": [load_before, os.getloadavg()[0]], "machine": machine, "rows": rows,
               "goals": goals})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
