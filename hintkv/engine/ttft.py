"""Where each request's time to first token goes: the scheduler's transitions add time to parts.

A sequence's `ttft_mark` is the clock up to which its `TtftParts` have accounted. Each transition
adds the time since the mark to one part and moves the mark, so the parts always sum to the time
from arrival to the mark, and to `ttft_s` at the first token:

    arrival ──queue──> admitted ──load──> loaded ──blocked──> [step: compute + shared] ... first token
                          ^                                  (preempted: blocked, then queue again)

A step's forward time is split among its sequences by their new tokens (`compute` is a
sequence's own share, `shared` the others'). Only sequences still waiting for their first token
are touched, so a step costs O(prefills in it).
"""

from __future__ import annotations

from hintkv.engine.outputs import SchedulerOutput
from hintkv.engine.sequence import Sequence


def arrived(seq: Sequence) -> None:
    seq.ttft_mark = seq.arrival


def admitted(seq: Sequence, now: float) -> None:
    if seq.first_token_time is None:
        seq.ttft.queue_s += now - seq.ttft_mark
        seq.ttft_mark = now


def loaded(seq: Sequence, now: float) -> None:
    if seq.first_token_time is None:
        seq.ttft.load_s += now - seq.ttft_mark
        seq.ttft_mark = now


def preempted(seq: Sequence, now: float) -> None:
    if seq.first_token_time is None:
        seq.ttft.blocked_s += max(0.0, now - seq.ttft_mark)
        seq.ttft_mark = now


def stepped(sched: SchedulerOutput, now: float) -> None:
    """A forward pass scheduled at `sched.started` ended at `now` (call before its tokens land)."""
    total = sched.num_batched_tokens
    if not total:
        return
    dt = now - sched.started
    for s in sched.scheduled:
        seq = s.seq
        if seq.first_token_time is not None:
            continue
        p = seq.ttft
        p.blocked_s += max(0.0, sched.started - seq.ttft_mark)
        own = dt * s.num_new_tokens / total
        p.compute_s += own
        p.shared_s += dt - own
        seq.ttft_mark = now
