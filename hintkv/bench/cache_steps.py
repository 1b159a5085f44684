"""`bench cache`'s scheduler steps over one world: RUNNING sequences decoding, one finishing and
one resuming per step, SAM's per-step work and the connector's poll; the step's bookkeeping, the
write-down flush after it and each part timed on its own.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

from hintkv.bench.cache_world import BS, PARTS, RUNNING, World
from hintkv.engine.sequence import Sequence


class _Laps:
    """Times consecutive parts of one step: `lap(part)` closes the part that just ran."""

    def __init__(self, parts: dict[str, list[float]], t0: int) -> None:
        self.parts, self.mark = parts, t0

    def __call__(self, part: str) -> None:
        t = time.perf_counter_ns()
        self.parts[part].append((t - self.mark) / 1e6)
        self.mark = t


class StepLoop:
    """One world's scheduler steps with RUNNING sequences decoding: per step its bookkeeping
    (`step_ms`), the write-down flush after it (`flush_ms`) and each part (`parts`, ms)."""

    def __init__(self, w: World, gc_ms: Callable[[], float] | None = None) -> None:
        self.w = w
        self.gc_ms = gc_ms  # the collector's pauses so far (ms): a step's share is its `gc` part
        kv = w.kv
        per_seq = 8 + 2  # a running sequence's blocks: 8-block prompt + room to decode
        self.running_target = min(RUNNING, max(1, (w.num_blocks // 2) // per_seq))
        self.running: list[Sequence] = []
        for _ in range(self.running_target):
            s = w.fresh_seq(8)
            m = kv.match_prefix(s)
            kv.admit(s, m, s.num_tokens)
            s.num_computed_tokens = s.num_tokens
            kv.commit(s)
            w.kv.flush_write_downs()
            self.running.append(s)
        # the ops phase ran events but no steps: settle the re-ranks, rechecks and predicted
        # prefetches it left due, so the steps measure the steady state, not that backlog
        w.kv.ranking.tick(w.clock(), w.sessions.sessions)
        w.sam.catch_up(w.clock())
        w.kv.tiers.poll()
        w.kv.flush_write_downs()
        w.stack.flush()
        self.loading: list[Sequence] = []
        self.step_ms: list[float] = []
        self.flush_ms: list[float] = []
        self.parts: dict[str, list[float]] = {p: [] for p in [*PARTS, "cpu", "gc"]}
        # per step, the engine thread's context switches (voluntary: it blocked, on the GIL or a
        # lock; involuntary: the OS preempted it): a step with neither ran start to end on a core
        self.switches: list[tuple[int, int]] = []

    def step(self) -> None:
        w, kv, running, loading = self.w, self.w.kv, self.running, self.loading
        g0 = self.gc_ms() if self.gc_ms is not None else 0.0
        ru0 = resource.getrusage(resource.RUSAGE_THREAD)
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        lap = _Laps(self.parts, t0)
        w.sam.on_step(w.clock())
        lap("sam")
        w.kv.tiers.poll()
        lap("poll")
        for s in [s for s in loading if kv.load_ready(s)]:  # a resumed session's load landed
            kv.finish_load(s)
            loading.remove(s)
            kv.free(s)
            w.sam.on_done(s.session_key, s.block_hashes[:s.num_computed_tokens // BS])
        lap("land")
        for s in running:
            s.token_ids.append(3)
        i = 0
        while i < len(running):  # one pass; a sequence that does not fit is skipped
            i += kv.append_many(running[i:] if i else running, 1) + 1
        lap("append")
        # one finishes: its session now holds its blocks
        done = running.pop(0)
        kv.free(done)
        lap("finish")
        # the session due first resumes: prefix from the device and the host tier
        i = w.next_resume()
        key = w.sam.on_arrival(w._ref(i))
        s = w.seq(w.contexts[i] + [11], w.hashes[i])
        s.session_key = key
        m = kv.match_prefix(s)
        rest = s.num_tokens - m.num_tokens - len(m.lower) * BS  # computed after the prefix
        if kv.can_admit(s, m, rest):
            if kv.admit(s, m, rest):
                loading.append(s)
            else:
                s.num_computed_tokens = s.num_tokens
                kv.commit(s)
                kv.free(s)
                w.sam.on_done(key, s.block_hashes[:s.num_computed_tokens // BS])
        else:
            w.sam.on_done(key, w.hashes[i])
        lap("resume")
        # post-forward update of the running batch
        for s in running:
            s.num_computed_tokens += 1
        kv.commit_many(running)
        lap("commit")
        t1 = time.perf_counter_ns()
        self.parts["cpu"].append((time.thread_time_ns() - c0) / 1e6)
        ru1 = resource.getrusage(resource.RUSAGE_THREAD)
        self.switches.append((ru1.ru_nvcsw - ru0.ru_nvcsw, ru1.ru_nivcsw - ru0.ru_nivcsw))
        self.parts["gc"].append((self.gc_ms() - g0) if self.gc_ms is not None else 0.0)
        kv.flush_write_downs()
        t2 = time.perf_counter_ns()
        self.step_ms.append((t1 - t0) / 1e6)
        self.flush_ms.append((t2 - t1) / 1e6)
        # the forward pass, not timed: in `serve` the mover threads run the copies this step
        # started (write-downs, loads) while the model computes; without a model they would
        # take the GIL inside the next step's bookkeeping instead
        w.stack.flush()
        fresh = w.fresh_seq(8)  # keep the batch at its size (not timed: a new request's prefill)
        m = kv.match_prefix(fresh)
        if kv.can_admit(fresh, m, fresh.num_tokens):
            kv.admit(fresh, m, fresh.num_tokens)
            fresh.num_computed_tokens = fresh.num_tokens
            kv.commit(fresh)
            kv.flush_write_downs()
            running.append(fresh)

    def close(self) -> None:
        for s in self.running + self.loading:
            self.w.kv.free(s)
        self.w.kv.check_integrity()
        self.w.sessions.check_integrity()
