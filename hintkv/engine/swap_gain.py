"""`prefill-judged`: a swap for a new prefill happens only when it saves more than it costs.

`prefill-fair` (`engine.admission_swap`) swaps running decodes out whenever a new prefill has no
room. On a busy engine that is what cuts TTFT (issue 8, `bench swarm_sched`: the simulated
engine is busy 93-95% of the time); on an engine that barely queues it is a loss: the displaced
decode waits for the newcomer's prefill and then for room, while the newcomer would have waited
only a few decode steps (the quiet live `bench swarm --quick`, session 9: every swapping run had a
longer task than lru under fcfs). So each swap is judged, from the engine's own measurements
(`StepCosts`: a decode step, a prefill token, the share of time the engine is busy):

    wait   = the newcomer's wait without the swap: until enough running decodes end by
             themselves (their remaining tokens x a decode step)
    gain   = wait / (1 - busy share)    the queue it saves: a busy engine's queue grows as
                                        1 / (1 - load) (M/G/1), and room that frees by itself
                                        goes to whoever is ahead first
    delay  = per displaced decode: the newcomer's prefill, then room, which comes back when the
             newcomer ends or the others free it, whichever is first: prefill + min(serve, wait)
    swap when gain > delay x victims

An idle engine (busy share near 0) so swaps only for a newcomer whose whole call is shorter than
what the decodes still have to go (shortest remaining work first, `short-first`-like); a
saturated one swaps as `prefill-fair` does. Until both step costs are measured it swaps as
`prefill-fair` does. Everything else (order, the displaced decodes' bounded wait) is
`prefill-fair`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hintkv.engine.admission import register_admission, resident_blocks, swap_frees
from hintkv.engine.admission_swap import MAX_OVERTAKES, PrefillFairAdmission

if TYPE_CHECKING:
    from hintkv.cache.manager import KVCacheManager
    from hintkv.engine.outputs import SchedulerOutput
    from hintkv.engine.sequence import Sequence

MIN_IDLE = 0.05  # the load factor 1 / (1 - busy) is capped at 20x (a saturated engine)


@dataclass(slots=True)
class StepCosts:
    """Step costs and load, measured from the engine's steps on the scheduler's clock, as
    moving averages over about `window` steps."""

    window: int = 64
    decode_s: float | None = None  # a step of decodes only
    token_s: float | None = None  # what one prefill token adds to a step
    busy_s: float = 0.0  # decayed seconds spent in steps that ran something
    elapsed_s: float = 0.0  # decayed seconds, steps and the idle gaps between them
    last_end: float | None = None

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
        if not num_seqs:
            return
        if not prefill_tokens:
            self.decode_s = dt if self.decode_s is None else (1 - a) * self.decode_s + a * dt
        elif self.decode_s is not None:
            per = max(0.0, dt - self.decode_s) / prefill_tokens
            self.token_s = per if self.token_s is None else (1 - a) * self.token_s + a * per


def remaining(seq: Sequence) -> int:
    """Output tokens a running decode still has to go (at most: it may stop earlier)."""
    return max(0, seq.sampling.max_tokens - seq.num_output_tokens)


@register_admission("prefill-judged")
class PrefillJudgedAdmission(PrefillFairAdmission):
    """`prefill-fair` whose every swap must save the newcomer more queue time than it costs the
    displaced decodes (see the module docstring)."""

    def __init__(self, max_overtakes: int = MAX_OVERTAKES, max_skips: int = 16, max_scan: int = 64,
                 max_model_len: int | None = None) -> None:
        super().__init__(max_overtakes, max_skips, max_scan, max_model_len)
        self.costs = StepCosts()
        self.num_swaps_judged = 0
        self.num_swaps_declined = 0

    def stepped(self, sched: SchedulerOutput, now: float) -> None:
        prefill = sum(s.num_new_tokens for s in sched.scheduled if s.num_new_tokens > 1 and not s.spec_token_ids)
        self.costs.observe(sched.started, now, len(sched.scheduled), prefill)

    def swap_pays(self, head: Sequence, victims: list[Sequence], decodes: list[Sequence], short: int,
                  kv: KVCacheManager) -> bool:
        verdict = self.judge(head, victims, decodes, short, kv)
        self.num_swaps_judged += 1
        self.num_swaps_declined += not verdict
        return verdict

    def judge(self, head: Sequence, victims: list[Sequence], decodes: list[Sequence], short: int,
              kv: KVCacheManager) -> bool:
        c = self.costs
        if c.decode_s is None or c.token_s is None:
            return True  # nothing measured yet: prefill-fair
        bs, mml = kv.block_size, self.max_model_len
        freed, wait = 0, None
        for d in sorted(decodes, key=remaining):  # the ones that end first free their room first
            freed += swap_frees(d, bs, mml)
            if freed >= short:
                wait = remaining(d) * c.decode_s
                break
        if wait is None:
            return True  # decodes ending alone never make the room: only a swap does
        todo = max(1, head.num_tokens - resident_blocks(head, kv) * bs)
        prefill = todo * c.token_s + c.decode_s
        serve = head.sampling.max_tokens * c.decode_s  # the newcomer holds the room to its end
        gain = wait / max(1.0 - c.busy, MIN_IDLE)
        return gain > len(victims) * (prefill + min(serve, wait))
