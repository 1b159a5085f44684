"""Continuous batching with chunked prefill under a per-step token budget.

Each step: running sequences first (decodes and unfinished prefill chunks, FCFS), preempting the
newest running sequence when blocks run out (its KV is freed and recomputed later); then waiting
sequences in arrival order while budget, sequence slots and blocks allow (FCFS: no skipping).

A sequence whose prefix continues in a lower tier (host, disk) is admitted with blocks for it
and set aside as LOADING while the blocks arrive; it takes no token budget, and the sequences
behind it keep being admitted and run. Each step first moves the loads that have landed (or
timed out) to running, advanced over the blocks that arrived.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hintkv.cache.manager import KVCacheManager
from hintkv.engine.sequence import SeqStatus, Sequence


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step completes the sequence's KV, so its next token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    out_of_room: list[Sequence] = field(default_factory=list)  # alone and still no room: finish

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.loading: list[Sequence] = []  # admitted, waiting for prefix KV from a lower tier
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out (finished or aborted) and give its blocks back."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.loading:
            self.loading.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SeqStatus.FINISHED

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _others_hold_blocks(self) -> bool:
        """Blocks will come free without finishing anyone: loads or prefetches in flight."""
        return bool(self.loading) or self.kv.num_prefetching_blocks > 0

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        for seq in [s for s in self.loading if self.kv.load_ready(s)]:
            self.kv.finish_load(seq)
            self.loading.remove(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.kv.can_append(seq, n):
                victim = self.running.pop()
                if victim is seq:
                    if not self.running and not out.scheduled and not self._others_hold_blocks():
                        out.out_of_room.append(seq)  # needs more than the whole pool
                    else:
                        self._preempt(seq)
                        out.preempted.append(seq)
                    break
                self._preempt(victim)
                out.preempted.append(victim)
            else:
                self.kv.append(seq, n)
                out.scheduled.append(ScheduledSeq(seq, n))
                budget -= n
                i += 1
        while (self.waiting and budget > 0 and len(self.running) + len(self.loading) < self.max_num_seqs
               and not out.preempted):
            seq = self.waiting[0]
            match = self.kv.match_prefix(seq)
            if match.lower:  # load first (no budget now); computes once the blocks land
                if not self.kv.can_admit(seq, match, 0):
                    match.lower, match.lower_tiers = [], []  # no room to load into: compute it
                else:
                    self.kv.admit(seq, match, 0)
                    self.waiting.popleft()
                    seq.status = SeqStatus.LOADING
                    self.loading.append(seq)
                    continue
            n = min(seq.num_tokens - match.num_tokens, budget)
            if not self.kv.can_admit(seq, match, n):
                if (not self.running and not out.scheduled and not self._others_hold_blocks()
                        and not self.kv.can_admit(seq, match, 1)):
                    self.waiting.popleft()
                    out.out_of_room.append(seq)
                break
            self.kv.admit(seq, match, n)
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return out
