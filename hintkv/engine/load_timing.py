"""When a sequence whose prefix a lower tier holds computes: in the step its load starts, or later.

    timing = make_load_timing("same-step")
    limit = timing.wait_limit(n_blocks, tiers, costs, out)  # seconds this step may wait; 0: don't

A sequence admitted with a prefix held below (host, disk) is LOADING while its blocks come back
(`batching.admit_waiting`); it takes no budget in that step.

- `next-step` (the default): it computes in the first step after its load landed. The copy overlaps the
  current step's forward pass, and the sequence waits for the rest of that step: a host hit of a
  few milliseconds of copying waits a whole step (beside a running decode, 62.8 ms of a 333 ms
  TTFT: tenth session, in-process).
- `same-step` (opt-in; what a synchronous KV connector does, e.g. LMCache's retrieve before
  vLLM's forward): the step waits for the load inside `schedule()` (with the engine's state
  lock released: `Scheduler`'s `unlocked`, so the server's locked reads never wait for a copy)
  and computes the sequence in that step, when the wait costs the step's other sequences less than the step it saves: each
  of the k sequences already in the step waits w, the loaded one gains one step (at least the
  step's own forward time F), so it waits only while k·w <= F, with w and F from the tier
  connector's measured costs (bandwidth per tier, prefill seconds per token; F counts the
  step's batched tokens only, which undervalues a decode step: the rule errs on not waiting).
  With nothing else in the step (a running prefill that yielded to the load counts: it runs
  later in the step) the engine would idle for the load anyway: it waits up to a
  few times the expected copy (at least the engine's own idle wait). The limit is the step's:
  what earlier loads of the step waited is taken off the next one's (`batching.land_new_loads`). A load not landed by the limit stays LOADING and computes in a
  later step, exactly as `next-step`.

The wait is the mover's (`Mover.wait_done`): the simulator's blocks in simulated time (its event
clock runs the copies, the agents' calls and the other instances meanwhile, inside the scheduler's
`unlocked` as live: `sim.engine` applies edits at once and adds requests after the step).
New policies register with `@register_load_timing("name")`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hintkv.registry import Registry

if TYPE_CHECKING:
    from hintkv.cache.tier_costs import TransferCosts
    from hintkv.engine.outputs import SchedulerOutput

IDLE_WAIT_FACTOR = 3.0  # nothing else in the step: wait up to this many expected copies,
IDLE_MIN_WAIT_S = 0.05  # and at least as long as an idle engine waits for loads (LLMEngine.step)

_REGISTRY: Registry[LoadTiming] = Registry("load timing")
register_load_timing = _REGISTRY.register


def load_timing_names() -> list[str]:
    return _REGISTRY.names()


def make_load_timing(name: str) -> LoadTiming:
    return _REGISTRY.make(name)


class LoadTiming:
    name = "base"

    def wait_limit(self, tiers: list[str], costs: TransferCosts, out: SchedulerOutput, later: int = 0) -> float:
        """Seconds the step being scheduled (`out`, so far; `later`: running prefills that yielded
        and are scheduled after the loads) may wait for a load of one block from each of `tiers`
        before its forward pass; 0: leave it for a later step."""
        return 0.0


@register_load_timing("next-step")
class NextStep(LoadTiming):
    pass


@register_load_timing("same-step")
class SameStep(LoadTiming):
    def wait_limit(self, tiers: list[str], costs: TransferCosts, out: SchedulerOutput, later: int = 0) -> float:
        expected = sum(costs.load_s(t) for t in tiers)
        others = len(out.scheduled) + later  # a prefill that yielded runs in this step too: not idle
        if not others:
            return max(IDLE_WAIT_FACTOR * expected, IDLE_MIN_WAIT_S)
        limit = costs.prefill_s_per_token * out.num_batched_tokens / others
        return limit if expected <= limit else 0.0
