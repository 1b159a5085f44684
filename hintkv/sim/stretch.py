"""Decode stretches: k engine steps of nothing but the same decodes, as ONE clock event.

A step whose batch is every running sequence, each decoding one token, with nothing waiting or
loading, is followed by steps of the same form until something happens: a request arrives or a
copy lands (a clock event), a sequence fills its block (commit) or needs a new one (allocation),
a sequence finishes, SAM's clock comes due (a recheck or a predicted resume), a prefetch is in
flight, the pool's keep-alive comes due. Until then every step is determined: the scheduler would
batch the same sequences, the cost model gives each step's time from their contexts, and the
update appends one token to each. `plan` finds how many such steps follow a freshly scheduled one
(`k`, with each one's time), `finish` applies them at the last one's end:

    per step, in the order the real steps do it: the step counters, the host-tier integral, the
    tier cost model's observation, the admission policy's `order_running` and `stepped` (each
    only where it does something: not the base policy's empty hooks, nor a sample too small); per
    sequence: k tokens, k computed, k sent, the last token's time

so the report is identical field by field to stepping them one by one (`SimEngine(fast_decode=
False)`; tests/sim/test_sim_stretch.py compares every figure). The clock's event count is what
shrinks (one event for k steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hintkv.cache import tier_costs
from hintkv.engine.admission import AdmissionPolicy
from hintkv.engine.outputs import SchedulerOutput

if TYPE_CHECKING:
    from hintkv.sim.engine import SimEngine


@dataclass(slots=True)
class Stretch:
    ms: list[float]  # each step's forward time (ms[0]: the step just scheduled)
    times: list[float]  # times[i]: when step i starts; times[k]: when the last one ends


def plan(eng: SimEngine, sched: SchedulerOutput, ms0: float, token: int) -> Stretch | None:
    """The stretch that starts with `sched` (just scheduled, `ms0` long), or None when fewer than
    two steps of it are certain."""
    sch = eng.scheduler
    if sch.waiting or sch.loading or sched.preempted or sched.out_of_room or sch.proposer is not None:
        return None
    scheduled = sched.scheduled
    if len(scheduled) != len(sch.running):
        return None
    bs, max_len = sch.kv.block_size, sch.max_model_len
    k = math.inf
    contexts = []
    for s in scheduled:
        seq = s.seq
        c = seq.num_computed_tokens
        n_prompt = seq.num_prompt_tokens
        if s.num_new_tokens != 1 or s.spec_token_ids or c < n_prompt or seq.first_token_time is None:
            return None
        if not s.samples:  # a preempted sequence recomputing past its prompt, 1 token left it by
            return None    # the budget: the real step samples nothing for it (reachable only with a
            # token budget at or below the running count; no test reaches it cheaply, see sim2's report)
        p = seq.sampling
        if token in p.stop_token_ids or (token in sch.eos_token_ids and not p.ignore_eos):
            return None
        if eng.awaits_first(seq.request_id):
            return None
        n = len(seq.token_ids)
        k = min(k,
                # no block fills (commit); then none is allocated either: after the schedule a
                # decode has room for its token, so its registered (full) blocks are not all
                (seq.num_registered_blocks + 1) * bs - 1 - c,
                p.max_tokens - (n - n_prompt) - 1)  # no sequence finishes
        if max_len is not None:
            k = min(k, max_len - n - 1)
        if k < 2:
            return None
        contexts.append(c)
    tiers = sch.kv.tiers
    spm = None
    if tiers is not None:
        if sch.kv.num_prefetching_blocks:
            return None  # a prefetch lands at its deadline, a step's poll away
        spm = tiers.spm
    clock = eng.clock
    nxt = clock.next_time()
    nxt = math.inf if nxt is None else nxt
    t = clock()
    times = [t, t + max(0.0, ms0 / 1e3)]
    if times[1] >= nxt:
        return None
    due = sch.sam.next_due() if sch.sam is not None else math.inf
    ms = [ms0]
    batch = len(contexts)
    # step i's = costs.step_ms((), [c + i for c in contexts]), exactly
    later = eng.costs.decode_steps_ms(batch, sum(contexts) + batch, k - 1)
    for i in range(1, k):
        t = times[i]
        if t >= due or (spm is not None and not spm.quiet(t)):
            break
        m = later[i - 1]
        end = t + max(0.0, m / 1e3)
        if end >= nxt:
            break
        ms.append(m)
        times.append(end)
    return Stretch(ms, times) if len(ms) >= 2 else None


def _overrides(policy: AdmissionPolicy, hook: str) -> bool:
    """True when `policy` has its own `hook` (the base class's does nothing)."""
    return getattr(type(policy), hook) is not getattr(AdmissionPolicy, hook)


def finish(eng: SimEngine, sched: SchedulerOutput, st: Stretch, token: int) -> None:
    """Apply the stretch's steps (the clock stands at its end); the caller then wakes the engine."""
    sch = eng.scheduler
    stats = eng.stats
    k = len(st.ms)
    num_tokens = len(sched.scheduled)
    host = eng.host_blocks()
    # calls that do nothing here are skipped: the base policy's hooks (fcfs), and the tier cost
    # model's prefill sample below its size (a decode stretch's batch is its token count)
    observe = (sch.kv.tiers.costs.observe_prefill
               if sch.kv.tiers is not None and num_tokens >= tier_costs.MIN_PREFILL_TOKENS else None)
    budget = sch.max_num_batched_tokens
    admission = sch.admission
    order = admission.order_running if _overrides(admission, "order_running") else None
    stepped = admission.stepped if _overrides(admission, "stepped") else None
    step = sched
    for i in range(k):
        if i:  # step i was scheduled at times[i]
            if order is not None:
                order(sch.running, budget)
            stats.num_steps += 1
            stats.busy_s += st.ms[i] / 1e3
            stats.num_batched_tokens += num_tokens
            if stepped is not None:
                step = SchedulerOutput(sched.scheduled, started=st.times[i])
        end = st.times[i + 1]  # and ended then
        if host is not None:
            eng.track_host(end, host)
        if stepped is not None:
            stepped(step, end)
        if observe is not None:
            observe(num_tokens, st.ms[i] / 1e3)
    end = st.times[k]
    # the last step's wait mark: no request waited and none arrived since (as after each step)
    eng.mark_wait(st.times[k - 1])
    add = [token] * k
    for s in sched.scheduled:
        seq = s.seq
        seq.token_ids.extend(add)
        seq.num_computed_tokens += k
        seq.num_sent_tokens += k
        seq.last_token_time = end
    eng.last_end = end
