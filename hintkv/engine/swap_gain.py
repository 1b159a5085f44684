"""`prefill-judged`: a swap for a new prefill happens only when it saves more than it costs.

`prefill-fair` (`engine.admission_swap`) swaps running decodes out whenever a new prefill has no
room. On a busy engine that is what cuts TTFT (issue 8, `bench swarm_sched`: the simulated
engine is busy 93-95% of the time); on an engine that barely queues it is a loss: the displaced
decode waits for the newcomer's prefill and then for room, while the newcomer would have waited
only a few decode steps (the quiet live `bench swarm --quick`, session 9: every swapping run had a
longer task than lru under fcfs). So each swap is judged, from the engine's own measurements
(`StepCosts`: a decode step, a prefill token, the share of time the engine is busy):

    wait   = the newcomer's wait without the swap: until enough running sequences (decodes,
             displaced ones that came back, prefills) end by themselves and free the room
             (their tokens still to compute x a prefill token + outputs still to go x a step)
    gain   = wait / (1 - busy share)    the queue it saves: a busy engine's queue grows as
                                        1 / (1 - load) (M/G/1), and room that frees by itself
                                        goes to whoever is ahead first
    delay  = per displaced decode: the newcomer's prefill, then room, which comes back when the
             newcomer ends or the others free it, whichever is first: prefill + min(serve, wait)
    swap when gain > delay x victims

The costs: a decode-only step (`StepCosts.decode_s`: the median of the first `FIRST_SAMPLES`
steps, then a moving average, so a fresh engine's warm-up step does not skew it; a step of zero
length on the scheduler's clock measures nothing) and a prefill token (the tier connector's
`TransferCosts.prefill_s_per_token`, the one owner of that figure; swaps need a tier, so it is
there). Outputs still to go are `max_tokens` minus the outputs so far, capped by the model's
length: a call that does not send `max_tokens` gets the server's whole room (server/admission.py)
and so looks long. With speculative decoding a verify step yields more than one token; the
estimate still counts one token a step (it overstates `wait` and `serve` alike).

Where the load factor is capped (a saturated engine, busy share >= 0.95) a swap still declines
when the room is about to come back (a decode near its end); otherwise it swaps as `prefill-fair`
does. On an idle engine it swaps only for a newcomer whose prefill and room are shorter than the
wait it saves. Until a decode step is measured it swaps as `prefill-fair` does. Everything else
(order, the displaced decodes' bounded wait) is `prefill-fair`'s. Measured (docs/benchmarks/history/swarm.md,
tenth session): in the simulated `bench swarm_sched` cells it equals `prefill-fair`; live runs at
a load of 7-13 on 2 cores could not separate them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hintkv.engine.admission import register_admission
from hintkv.engine.admission_swap import MAX_OVERTAKES, PrefillFairAdmission, swap_frees

if TYPE_CHECKING:
    from hintkv.cache.manager import KVCacheManager
    from hintkv.engine.outputs import SchedulerOutput
    from hintkv.engine.sequence import Sequence

MIN_IDLE = 0.05  # the load factor 1 / (1 - busy) is capped at 20x (a saturated engine)
FIRST_SAMPLES = 8  # decode steps whose median seeds the moving average (a warm-up step is one)
MIN_SAMPLES = 3  # decode steps before the cost counts as measured (a median of 3 drops one outlier)


@dataclass(slots=True)
class StepCosts:
    """A decode-only step's cost and the engine's load, measured from its steps on the scheduler's
    clock: the median of the first `FIRST_SAMPLES` decode steps, then a moving average over about
    `window` steps; None until `MIN_SAMPLES` steps of non-zero length were seen."""

    window: int = 64
    first: list[float] = field(default_factory=list)  # the first decode steps' lengths
    average: float | None = None  # the moving average, once `first` is full
    busy_s: float = 0.0  # decayed seconds spent in steps that ran something
    elapsed_s: float = 0.0  # decayed seconds, steps and the idle gaps between them
    last_end: float | None = None

    @property
    def decode_s(self) -> float | None:
        if self.average is not None:
            return self.average
        return statistics.median(self.first) if len(self.first) >= MIN_SAMPLES else None

    @property
    def busy(self) -> float:
        """The share of the clock the engine spent running steps (0 when nothing is measured)."""
        return self.busy_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def observe(self, started: float, now: float, num_seqs: int, prefill_tokens: int) -> None:
        dt = max(0.0, now - started)
        gap = 0.0 if self.last_end is None else max(0.0, started - self.last_end)
        self.last_end = now
        a = 1.0 / self.window
        ran = dt if num_seqs else 0.0  # a step that ran nothing waited for loads: idle
        self.busy_s = (1 - a) * self.busy_s + ran
        self.elapsed_s = (1 - a) * self.elapsed_s + dt + gap
        if not num_seqs or prefill_tokens or dt <= 0:
            return  # a decode-only step of measurable length is the one sample
        if self.average is not None:
            self.average = (1 - a) * self.average + a * dt
        elif len(self.first) < FIRST_SAMPLES - 1:
            self.first.append(dt)
        else:
            self.first.append(dt)
            self.average = statistics.median(self.first)


def remaining(seq: Sequence, max_model_len: int | None = None) -> int:
    """Output tokens a running sequence still has to go (at most: it may stop earlier), capped by
    the model's length."""
    left = seq.sampling.max_tokens - seq.num_output_tokens
    if max_model_len is not None:
        left = min(left, max_model_len - seq.num_tokens)
    return max(0, left)


@register_admission("prefill-judged")
class PrefillJudgedAdmission(PrefillFairAdmission):
    """`prefill-fair` whose every swap must save the newcomer more queue time than it costs the
    displaced decodes (see the module docstring)."""

    def __init__(self, max_overtakes: int = MAX_OVERTAKES, max_skips: int = 16, max_scan: int = 64,
                 max_model_len: int | None = None) -> None:
        super().__init__(max_overtakes, max_skips, max_scan, max_model_len)
        self.costs = StepCosts()
        self.num_judgements = 0  # swap judgements (a newcomer that waits N steps is judged N times)
        self.num_declined = 0  # of them, the ones that kept the decodes running

    def stepped(self, sched: SchedulerOutput, now: float) -> None:
        prefill = sum(s.num_new_tokens for s in sched.scheduled if s.num_new_tokens > 1 and not s.spec_token_ids)
        self.costs.observe(sched.started, now, len(sched.scheduled), prefill)

    def swap_pays(self, head: Sequence, victims: list[Sequence], enders: list[Sequence], short: int,
                  cached_blocks: int, kv: KVCacheManager) -> bool:
        verdict = self.judge(head, victims, enders, short, cached_blocks, kv)
        self.num_judgements += 1
        self.num_declined += not verdict
        return verdict

    def judge(self, head: Sequence, victims: list[Sequence], enders: list[Sequence], short: int,
              cached_blocks: int, kv: KVCacheManager) -> bool:
        step_s = self.costs.decode_s
        if step_s is None or kv.tiers is None:
            return True  # nothing measured yet (or nowhere to swap to): prefill-fair
        token_s = kv.tiers.costs.prefill_s_per_token
        bs, mml = kv.block_size, self.max_model_len

        def to_end(s: Sequence) -> float:  # its prompt still to compute, then its outputs
            return max(0, s.num_tokens - 1 - s.num_computed_tokens) * token_s + remaining(s, mml) * step_s

        freed, wait = 0, None
        for d in sorted(enders, key=to_end):  # the ones that end first free their room first
            freed += swap_frees(d, bs, mml)
            if freed >= short:
                wait = to_end(d)
                break
        if wait is None:
            return True  # sequences ending alone never make the room: only a swap does
        todo = max(1, head.num_tokens - cached_blocks * bs)
        prefill = todo * token_s + step_s
        serve = remaining(head, mml) * step_s  # the newcomer holds the room to its end
        gain = wait / max(1.0 - self.costs.busy, MIN_IDLE)
        return gain > len(victims) * (prefill + min(serve, wait))
