"""The first half of a step: which sequences run, with how many tokens (`Scheduler.schedule`).

Two passes over the scheduler's queues, both called from `Scheduler.schedule`:

- `schedule_running`: running sequences in order while the budget lasts, each given blocks for
  its new tokens (`KVCacheManager.can_append`/`append`; a run of decodes in one `append_many`
  pass), preempting from the end of the running
  list when blocks run out; a prefill may yield to a better waiting candidate or take part of
  its chunk (the admission policy's `yields`/`cap`).
- `admit_waiting`: waiting sequences in the admission policy's order while budget, sequence
  slots and blocks allow; a prefix that continues in a lower tier is loaded first (LOADING);
  `land_new_loads` then waits for those loads as the load timing allows (`engine.load_timing`:
  `same-step` computes a host hit in the step its load starts) and schedules the ones that landed.

Speculative drafts come last (`add_drafts`), from what the step's real tokens left: a rejected
draft never displaces a real decode token, a prefill chunk or an admission.

Each transition adds to the request's TTFT parts (`engine.ttft`).
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import cache, partial
from typing import TYPE_CHECKING

from hintkv.engine import ttft
from hintkv.engine.admission import StepPlan, blocks_to_end
from hintkv.engine.admission_swap import swap_frees
from hintkv.engine.room_wait import earliest_room_s, lapses, note_admitted, note_blocked
from hintkv.engine.outputs import ScheduledSeq, SchedulerOutput
from hintkv.engine.sequence import SeqStatus, Sequence

if TYPE_CHECKING:
    from hintkv.engine.scheduler import Scheduler


def schedule_running(sch: Scheduler, out: SchedulerOutput, budget: int, i: int,
                     capped: list[ScheduledSeq] | None) -> tuple[int, int]:
    """Running sequences from index `i`, in order, while the budget lasts, preempting from the
    end of the list for room; returns (budget left, index of the first one not scheduled).
    `capped` (the first pass; None after the admissions): the policy may have a prefill yield
    to waiting candidates or take part of its chunk (noted there)."""
    while i < len(sch.running) and budget > 0:
        served = _decodes(sch, out, i, budget)
        if served:
            budget -= served
            i += served
            continue  # (a decode that did not fit comes next: the path below preempts)
        seq = sch.running[i]
        if capped is not None and sch.waiting and sch.admission.yields(seq, sch.waiting, sch.kv, budget):
            break  # this prefill and the ones after it go after the admissions
        n = chunk(sch, seq, seq.num_computed_tokens, budget)
        full = n
        if capped is not None:  # others wait: the waiting candidates, or a short prefill behind it
            n = sch.admission.cap(seq, n, budget, bool(sch.waiting) or _short_after(sch, i))
        if sch.admission.holds(seq, n, out, seq.num_computed_tokens):  # a finishing prefill's step stays short
            if capped is not None:
                break  # it and the ones after it go after the admissions, as a yield does
            i += 1
            continue
        while not sch.kv.can_append(seq, n):
            victim = sch.running.pop()
            if victim is seq:
                if alone(sch, out):
                    out.out_of_room.append(seq)  # needs more than the whole pool
                    seq.status = SeqStatus.WAITING  # in no queue: update_from_output finishes it
                else:
                    sch.preempt(seq)
                    out.preempted.append(seq)
                break
            sch.preempt(victim)
            out.preempted.append(victim)
        else:
            grow_kv(sch.kv, seq, n)
            out.scheduled.append(ScheduledSeq(seq, n))
            if n < full:
                capped.append(out.scheduled[-1])
            budget -= n
            i += 1
    return budget, i


def alone(sch: Scheduler, out: SchedulerOutput) -> bool:
    """Nothing but the sequence asking holds device blocks or will free some without finishing: none running
    (still listed or already scheduled this step), none refused this step as larger than the pool (it still
    holds its blocks until `update_from_output`), no load or prefetch in flight. A sequence without room then
    needs more than the whole pool: both passes refuse it (`out.out_of_room`) rather than wait."""
    return not sch.running and not out.scheduled and not out.out_of_room and not sch.others_hold_blocks()


def _short_after(sch: Scheduler, i: int) -> bool:
    """A running prefill after index `i` that ends within half a step (`AdmissionPolicy.short_rest`:
    half the step's budget, not the budget the decodes left; left without budget behind
    `running[i]`, it would wait for a long prefill's every chunk)."""
    return any(sch.admission.short_rest(s) for s in sch.running[i + 1:])


def _decodes(sch: Scheduler, out: SchedulerOutput, i: int, budget: int) -> int:
    """The run of decodes (one token to go, no drafts) from running index `i`, at most `budget`
    of them, given their blocks in one `KVCacheManager.append_many` pass; returns how many were
    scheduled (the run stops before the first that does not fit). A decode never yields and is
    never capped (`AdmissionPolicy.yields`/`cap`), so this is the per-sequence path's outcome."""
    running = sch.running
    j, end = i, min(len(running), i + budget)
    while j < end and running[j].num_tokens - running[j].num_computed_tokens == 1:
        j += 1
    if j == i:
        return 0
    run = running[i:j]
    served = sch.kv.append_many(run, 1)
    scheduled = out.scheduled
    for seq in run[:served]:
        seq.peak_kv_blocks = max(seq.peak_kv_blocks, len(seq.block_table))
        scheduled.append(ScheduledSeq(seq, 1))
    return served


def _reserved(sch: Scheduler) -> int:
    """Blocks the running and loading sequences still need to reach their end."""
    bs, mml = sch.kv.block_size, sch.max_model_len
    return sum(max(0, blocks_to_end(s, bs, mml) - len(s.block_table)) for s in [*sch.running, *sch.loading])


def admit_waiting(sch: Scheduler, out: SchedulerOutput, budget: int, at: int) -> int:
    """Start waiting sequences in the admission policy's order while budget, sequence slots
    and blocks allow (`hintkv.engine.admission`), into the running list from index `at`;
    returns the budget left."""
    if not sch.waiting:
        return budget
    policy = sch.admission
    plan = StepPlan(reserved=_reserved(sch) if policy.reserves else 0)
    held = 0  # candidates the policy holds with room (`holds`): they wait, but not for room
    for seq in policy.order(sch.waiting, sch.kv):
        if budget <= 0 or len(sch.running) + len(sch.loading) >= sch.max_num_seqs:
            return budget
        by_itself = alone(sch, out)
        match = sch.kv.match_prefix(seq, keep=True, lower=False)  # room reads the device run only
        fits = by_itself or policy.room(seq, match, sch.kv, plan)
        if fits:  # a candidate without room is skipped or stops admission: its plan is not needed
            sch.kv.match_lower(seq, match, loadable=True)  # led by the blocks a prefetch brings up
        if match.lower and fits:  # load first (no budget now; a prefetch in flight is taken
            # over: `TierLoads.adopt`); computes once the blocks land
            if not sch.kv.can_admit(seq, match, 0):  # no room to load its own run into: only the
                k = match.num_adopted  # blocks a prefetch brings up (their room is held), or compute
                match.lower, match.lower_tiers = match.lower[:k], match.lower_tiers[:k]
            if match.lower:
                _admit(sch, seq, match, 0, SeqStatus.LOADING, plan, out.started)
                sch.loading.append(seq)
                continue
        n = chunk(sch, seq, match.num_tokens, budget)
        if fits and policy.holds(seq, n, out, match.num_tokens):
            # stays waiting: a finishing prefill's step stays short; its resident prefix is kept
            # from the candidates admitted after it, as a skipped one's is (`skipped`)
            plan.kept.update(b.block_id for b in match.blocks if b.hash is not None)
            held += 1
            continue
        if not fits or not sch.kv.can_admit(seq, match, n):
            if by_itself:  # (so it fits by the policy) the whole pool is free to it and still holds
                # neither this chunk nor, then, its prompt: refused (asking room for 1 token here left a
                # one-chunk prompt larger than the pool queued for good, review_sim21b finding 3)
                sch.waiting.remove(seq)
                sch.release_queued(seq)
                out.out_of_room.append(seq)
                return budget
            # its wait for room, estimated once and only where used (on the plan as it stands: `skipped`
            # asks before it reserves anything)
            wait = cache(partial(earliest_room_s, sch, seq, match, plan))
            note_blocked(sch, seq, wait, out.started)  # SAM ranks a hinted session's kept prefix by it
            # the policy decides what it keeps: its prefix lapses when the wait is longer than its reload
            if policy.skipped(seq, match, plan, partial(lapses, sch, match, wait)):
                out.num_room_waits += 1
                continue
            out.num_room_waits = len(sch.waiting) - held  # it and every one behind it wait for room
            return budget
        _admit(sch, seq, match, n, SeqStatus.RUNNING, plan, out.started)
        seq.peak_kv_blocks = max(seq.peak_kv_blocks, len(seq.block_table))
        sch.running.insert(at, seq)
        at += 1
        out.scheduled.append(ScheduledSeq(seq, n))
        budget -= n
    return budget


def land_new_loads(sch: Scheduler, out: SchedulerOutput, budget: int, started: list[Sequence],
                   at: int, unlocked=None) -> int:
    """Loads started by this step's admissions (`started`): wait for each as long as the load
    timing allows (`engine.load_timing`) and compute the ones that landed in this step, with what
    the budget leaves, into the running list from index `at` (before the prefills that yielded:
    the pass that serves those later must not meet them again); the others stay LOADING. Each
    wait runs inside `unlocked()` (the driver's state lock released: `Scheduler`). Returns the
    budget left."""
    kv, timing = sch.kv, sch.load_timing
    waited = 0.0  # the limit is the step's: what earlier loads of this step waited counts
    for seq in started:
        if budget <= 0:
            break
        limit = timing.wait_limit(kv.tiers.load_tiers(seq.request_id), kv.tiers.costs, out,
                                  later=len(sch.running) - at) - waited
        if limit <= 0:
            continue
        t0 = sch.clock()
        with (unlocked or nullcontext)():
            landed = kv.tiers.wait_load(seq.request_id, limit)
        now = sch.clock()
        waited += now - t0
        if not landed:
            continue
        out.started = now  # the wait is not the forward pass (ttft.stepped, the step costs)
        kv.finish_load(seq)
        ttft.loaded(seq, now)
        sch.loading.remove(seq)
        seq.status = SeqStatus.RUNNING
        sch.running.insert(at, seq)
        at += 1
        n = chunk(sch, seq, seq.num_computed_tokens, budget)
        if not sch.admission.holds(seq, n, out, seq.num_computed_tokens) and kv.can_append(seq, n):
            grow_kv(kv, seq, n)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
    return budget


def make_room(sch: Scheduler) -> None:
    """Swap decodes out for a new prefill (`AdmissionPolicy.swaps`): when the best waiting
    candidate that has not sent its first token has no room, preempt running decodes (past their
    first token, never preempted before) in the policy's order until it would fit; nobody when
    all of them would not make it, or when the policy judges the swap not worth it
    (`swap_pays`: engine.admission_swap). Runs before the running pass, so no victim is scheduled."""
    policy, kv = sch.admission, sch.kv
    if kv.tiers is None or not policy.may_swap(sch.waiting):
        return  # nowhere to swap to (a preempted decode would be recomputed), or the policy holds
    head = next((s for s in policy.order(sch.waiting, kv) if s.first_token_time is None), None)
    if head is None:
        return
    bs, mml = kv.block_size, sch.max_model_len
    plan = StepPlan(reserved=_reserved(sch))
    match = kv.match_prefix(head, keep=True, lower=False)
    if policy.room(head, match, kv, plan):
        return
    need = max(0, blocks_to_end(head, bs, mml) - match.num_held)  # (in-flight blocks are its own)
    short = need - (kv.free_room(match) - plan.reserved)
    decodes = [s for s in sch.running if s.first_token_time is not None and s.num_preemptions == 0
               and s.num_computed_tokens >= s.num_tokens - 1]
    chosen, left = [], short
    for v in policy.swap_victims(decodes):
        chosen.append(v)
        left -= swap_frees(v, bs, mml)
        if left <= 0:
            break
    else:
        return
    if not policy.swap_pays(head, chosen, sch.running, short, len(match.blocks), kv):
        return
    for v in chosen:
        sch.running.remove(v)
        sch.preempt(v)
    policy.made_room(head)  # the head runs in this step: `holds` does not keep it waiting


def chunk(sch: Scheduler, seq: Sequence, done: int, budget: int, used: int | None = None) -> int:
    """The tokens `seq`, `done` of them computed, takes in this step out of `budget` (the policy's
    `chunk`: a long prefill's may be capped); `used`: the tokens already in the step (by default
    the step's budget less `budget`)."""
    todo = seq.num_tokens - done
    used = sch.max_num_batched_tokens - budget if used is None else used
    return sch.admission.chunk(todo, min(todo, budget), max(0, used), done)


def grow_kv(kv, seq: Sequence, n: int) -> None:
    """Grow `seq`'s KV by `n` tokens (`kv.can_append` said yes) and keep its peak block count."""
    kv.append(seq, n)
    seq.peak_kv_blocks = max(seq.peak_kv_blocks, len(seq.block_table))


def _admit(sch: Scheduler, seq: Sequence, match, n: int, status: SeqStatus, plan: StepPlan, now: float) -> None:
    """Admit waiting `seq` with `n` new tokens (LOADING: 0) and tell everyone once: the one admission path, which
    reads "first admission" (`Sequence.admitted_once`) before `kv.admit` sets it (review_sim22 finding 4)."""
    first = not seq.admitted_once
    sch.kv.admit(seq, match, n)
    ttft.admitted(seq, now)
    sch.waiting.remove(seq)
    sch.release_queued(seq)
    seq.status = status
    sch.admission.admitted(seq, plan)
    note_admitted(sch, seq, now, first)
    if sch.admission.reserves:
        plan.reserved += max(0, blocks_to_end(seq, sch.kv.block_size, sch.max_model_len)
                             - len(seq.block_table))


def add_drafts(sch: Scheduler, out: SchedulerOutput, budget: int) -> None:
    """Drafts for the step's decodes (one real token each, its next token sampled), last: at most
    `budget` tokens (what the real tokens left) and never past `sch.spec_max_rows` rows in the
    whole step (`--speculative-max-rows`). What is left is shared in order, each decode taking at
    most an even share of it (rounded up), so 8 decodes under 16 rows verify one draft each and 16
    or more verify none (vLLM's `disable_by_batch_size`, from the row count). None in a step that
    preempted: the blocks are short."""
    if sch.proposer is None or out.preempted:
        return
    left = min(budget, sch.spec_max_rows - out.num_batched_tokens)
    decodes = [s for s in out.scheduled if s.num_new_tokens == 1 and s.samples and s.seq.num_output_tokens]
    for j, s in enumerate(decodes):
        if left <= 0:
            return
        drafts = drafts_for(sch, s.seq, -(-left // (len(decodes) - j)))
        if drafts and sch.kv.can_append(s.seq, 1 + len(drafts)):
            grow_kv(sch.kv, s.seq, 1 + len(drafts))
            s.num_new_tokens += len(drafts)
            s.spec_token_ids = drafts
            left -= len(drafts)


def drafts_for(sch: Scheduler, seq: Sequence, limit: int) -> list[int]:
    """At most `limit` drafts for a decoding sequence; never more than its output room or the
    model's length allow (each costs a KV slot); none for a request that shapes its logits from its
    own tokens (penalties, min_tokens, bias: `SamplingParams.shapes_logits`)."""
    if seq.sampling.shapes_logits:
        return []
    room = min(sch.proposer.num_speculative_tokens, limit,
               seq.sampling.max_tokens - seq.num_output_tokens - 1)
    if sch.max_model_len is not None:
        room = min(room, sch.max_model_len - seq.num_tokens - 1)
    return sch.proposer.propose(seq, room) if room > 0 else []
