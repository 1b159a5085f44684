"""The simulated engine: the REAL scheduler and cache stack, stepped on the event clock.

    eng = SimEngine(cfg, cost_model, clock)
    eng.submit(request_id, prompt, max_tokens, session, on_first_token, on_done)
    eng.manage(ref, [CacheEdit("offload")])          # the real SAM, at once (management path)

One engine step is what `LLMEngine.step` does, with the forward pass replaced:

    sched = scheduler.schedule()                                   # real
    kv.flush_write_downs()                                         # real (copies: virtual mover)
    ms = cost_model.step_ms(chunks, decode contexts)               # instead of the model
         (+ the profile's idle_wakeup_ms when the step starts an idle engine)
    ... the clock advances by ms ...
    scheduler.update_from_output(sched, ModelRunnerOutput(...))    # real

With the `same-step` load timing `schedule()` may wait for a load (`Mover.wait_done`): the clock
runs on meanwhile, inside the `unlocked` the scheduler is given, as `LLMEngine.step` gives its own
(the state lock released): an edit (`manage`) that reaches this engine then applies at once, a
request (`submit`) is held until the step is scheduled, as the engine thread's inbox adds requests
between steps (it keeps its arrival time: the wait is queueing).
Every scheduled sequence that completes its KV gets one token (a fixed id: content never matters,
the workload's prompts carry their own tokens), exactly like the runner's sampler would give.
Requests that arrive during a step wait for the next one, as on the server. When nothing is
scheduled but work remains (a load in flight), the engine waits for the next clock event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from hintkv.cache.hashing import namespace_root
from hintkv.config import EngineConfig
from hintkv.engine.outputs import ModelRunnerOutput, SchedulerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import (
    CacheEdit,
    EditOutcome,
    RequestOutput,
    SamplingParams,
    SessionRef,
)
from hintkv.sim.clock import EventClock
from hintkv.sim.costs import CostModel
from hintkv.sim.pool import SimPool
from hintkv.sim.stretch import Stretch, finish, plan
from hintkv.sim.tiers import sim_tiers

WAIT_CAUSES = ("step", "budget", "seqs", "room")
SIM_TOKEN = 1000  # every sampled token (content is irrelevant to the cache: prompts come from traces)


class PromptDoesNotFit(ValueError):
    """A call whose prompt + output cannot fit the simulated device pool (the server refuses it): a bad setting."""


@dataclass(slots=True)
class _Pending:
    seq: Sequence
    on_first: Callable[[float], None] | None
    on_done: Callable[[RequestOutput, list], None]  # (the last output, the block hashes written)
    got_first: bool = False


class WaitMark(NamedTuple):
    """The waiting since the last step's mark (see `StepStats.wait_s`)."""
    cause: str  # what bound the last step: "budget", "seqs" or "room"
    left: int  # requests it left waiting for that bound
    room: int  # requests it left waiting for room (`SchedulerOutput.num_room_waits`)
    arrived: int  # requests that arrived since: they wait for the step in flight
    since: float  # when the mark was set


@dataclass(slots=True)
class StepStats:
    num_steps: int = 0
    busy_s: float = 0.0  # simulated seconds of forward passes
    num_batched_tokens: int = 0
    num_stretches: int = 0  # decode stretches run as one event (`sim.stretch`)
    peak_host_blocks: int = 0
    host_block_seconds: float = 0.0  # integral of host blocks over simulated time
    _last_t: float = 0.0
    _last_host: int = 0
    # request-seconds spent waiting for admission: "step" (arrived while a step ran, or while its
    # same-step load wait ran: waits for the next one), else left waiting by a step (from when it
    # was scheduled): "room" when that step's admissions refused it for room or stopped at one
    # refused ahead of it (`SchedulerOutput.num_room_waits`), else what bound the step: "budget"
    # (its token budget full), "seqs" (max_num_seqs running) or "room" (neither: e.g. the step only
    # waited for loads)
    wait_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WAIT_CAUSES, 0.0))


class SimEngine:
    def __init__(self, cfg: EngineConfig, costs: CostModel, clock: EventClock, num_blocks: int,
                 host_blocks: int = 0, model_name: str = "sim", pool: SimPool | None = None,
                 fast_decode: bool = True) -> None:
        """`fast_decode`: a stretch of steps that only decode runs as one event (`sim.stretch`;
        the same report); False steps each one."""
        self.cfg = cfg
        self.fast_decode = fast_decode
        self.costs = costs
        self.clock = clock
        self.scheduler = Scheduler.from_config(cfg, num_blocks, clock=clock)
        if host_blocks:
            self.scheduler.kv.tiers = sim_tiers(self.scheduler.kv, cfg.hints, host_blocks, clock, costs,
                                                pool, offload_mode=cfg.offload_mode)
        self.root = namespace_root(model_name, "sim", cfg.block_size, None)
        self.stats = StepStats()
        self._pending: dict[str, _Pending] = {}
        self._busy = False  # a step is in flight (its completion is queued on the clock)
        self._waiting = False  # nothing to schedule until one of our copies lands (clock.wait)
        self.last_end = -1.0  # when the last forward finished (a later start: woken from idle)
        self._wait = WaitMark("room", 0, 0, 0, 0.0)  # since the last step
        self._held: list[Callable[[], None]] | None = None  # requests held while schedule() runs
        self._locked = False  # inside schedule(), outside its load waits (`unlocked`)

    @property
    def kv(self):
        return self.scheduler.kv

    # ---- requests ------------------------------------------------------------------------
    def submit(self, request_id: str, prompt: list[int], max_tokens: int, session: SessionRef | None,
               on_first: Callable[[float], None] | None, on_done: Callable[[RequestOutput, list], None],
               block_hashes: list | None = None, arrived: float | None = None) -> None:
        """`block_hashes`: the prompt's full-block hashes under `self.root`, if already known."""
        if self._held is not None:  # schedule() is waiting for a load: after it, arrived now
            at = self.clock()
            self._held.append(lambda: self.submit(request_id, prompt, max_tokens, session, on_first,
                                                  on_done, block_hashes, arrived=at))
            return
        room = self.scheduler.kv.pool.num_blocks * self.cfg.block_size
        if len(prompt) + max_tokens > room:  # the server refuses these (LLMEngine.validate)
            raise PromptDoesNotFit(f"a {len(prompt)}-token prompt + {max_tokens} output tokens do not fit "
                             f"the {room}-token device pool: give the simulation a larger pool (--device-tokens) or a smaller --token-scale")
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        seq = Sequence(request_id, prompt, len(prompt), sampling, self.root, session=session)
        if block_hashes:
            seq.block_hashes = block_hashes
        self._count_wait(None)
        self.scheduler.add_request(seq)
        if arrived is not None:  # held while a step waited for its load: the wait is queueing,
            seq.arrival = seq.ttft_mark = arrived  # charged as arriving during a step
            self.stats.wait_s["step"] += self.clock() - arrived
        self._pending[request_id] = _Pending(seq, on_first, on_done)
        self._wake()

    def manage(self, ref: SessionRef, edits: list[CacheEdit]) -> list[EditOutcome]:
        if self._locked:  # only the clock's events call this: none runs outside a load wait
            raise RuntimeError("an edit inside schedule() outside its load wait")
        out = self.scheduler.manage(ref, edits)
        self._wake()  # an edit can free room for a waiting request
        return out

    # ---- the step loop -------------------------------------------------------------------
    def _resume(self) -> None:
        self._waiting = False
        self._step()

    def _wake(self, now: bool = False) -> None:
        """Start a step if there is work and none is in flight: as a zero-delay event (requests
        and copies due at this instant go first), or with `now` at once when nothing else is due
        at this instant (the same order; one heap push and pop fewer per step)."""
        if self._waiting and self.clock.unwait(self.scheduler.kv.tiers.stack.mover):
            self._waiting = self._busy = False  # new work: look now, not after the next copy
        if not self._busy and self.scheduler.has_work():
            self._busy = True
            due = self.clock.next_time()
            if now and (due is None or due > self.clock()):
                self._step()
            else:
                self.clock.after(0.0, self._step)

    def _count_wait(self, sched: SchedulerOutput | None, num_tokens: int = 0, at: float | None = None) -> None:
        """Charge the waiting since the last mark (see `StepStats.wait_s`); `sched`: a step was
        just scheduled at `at`, of `num_tokens` batched tokens (None: a request arrived, now)."""
        w = self._wait
        now = self.clock() if at is None else at
        if now > w.since:
            self.stats.wait_s[w.cause] += w.left * (now - w.since)
            self.stats.wait_s["room"] += w.room * (now - w.since)
            self.stats.wait_s["step"] += w.arrived * (now - w.since)
        if sched is None:
            self._wait = w._replace(arrived=w.arrived + 1, since=now)
            return
        s = self.scheduler
        if num_tokens + self.cfg.block_size > s.max_num_batched_tokens:
            cause = "budget"
        elif len(s.running) >= s.max_num_seqs:
            cause = "seqs"
        else:
            cause = "room"
        room = sched.num_room_waits
        if room > len(s.waiting):  # a refused call stays in `waiting` until the next step
            raise RuntimeError(f"{room} room waits counted, {len(s.waiting)} waiting: a miscount")
        self._wait = WaitMark(cause, len(s.waiting) - room, room, 0, now)

    def _step(self) -> None:
        start = self.clock()
        self._held, self._locked = [], True
        try:
            sched = self.scheduler.schedule(self._unlocked)  # (same-step: may wait for a load)
        finally:
            held, self._held, self._locked = self._held, None, False
        num_tokens = sched.num_batched_tokens
        self._count_wait(sched, num_tokens, start)  # the step's mark: when it was scheduled
        for call in held:  # arrived during its load wait; what it left waiting, waited since start
            call()
        if not sched.scheduled:
            outputs = self.scheduler.update_from_output(sched, ModelRunnerOutput())
            self._deliver(outputs)
            self._busy = False
            if self.scheduler.has_work():  # only copies in flight: look again after the next one
                tiers = self.scheduler.kv.tiers
                if tiers is None or self.clock.next_time() is None:
                    raise RuntimeError("the scheduler has work but schedules nothing, and no event "
                                       "can change that")
                self._busy = self._waiting = True
                self.clock.wait(tiers.stack.mover, self._resume)
            return
        self.scheduler.kv.flush_write_downs()  # as LLMEngine.step: victims are written down first
        ms = self.step_ms(sched)
        if start > self.last_end:  # the engine slept: the live thread pays a wake-up
            ms += self.costs.profile.idle_wakeup_ms
        self.stats.num_steps += 1
        self.stats.busy_s += ms / 1e3
        self.stats.num_batched_tokens += num_tokens
        st = plan(self, sched, ms, SIM_TOKEN) if self.fast_decode else None
        if st is not None:
            self.stats.num_stretches += 1
            self.clock.at(st.times[-1], lambda: self._finish_stretch(sched, st))
        else:
            self.clock.after(ms / 1e3, lambda: self._finish_step(sched, ms / 1e3))

    @contextmanager
    def _unlocked(self) -> Iterator[None]:
        """A load wait inside `schedule()`: the clock runs on; edits apply (`manage`)."""
        self._locked = False
        try:
            yield
        finally:
            self._locked = True

    def step_ms(self, sched: SchedulerOutput) -> float:
        chunks, decodes = [], []
        for s in sched.scheduled:
            c = s.seq.num_computed_tokens
            if s.num_new_tokens == 1 and c >= s.seq.num_prompt_tokens:
                decodes.append(c)
            else:
                chunks.append((s.num_new_tokens, c))
        return self.costs.step_ms(chunks, decodes)

    def host_blocks(self) -> int | None:
        """Blocks the host tier holds now (None: no host tier)."""
        tiers = self.scheduler.kv.tiers
        return None if tiers is None else tiers.stack.tiers[0].usage().num_blocks

    def _track_host(self) -> None:
        n = self.host_blocks()
        if n is not None:
            self.track_host(self.clock(), n)

    def track_host(self, now: float, n: int) -> None:
        """The host tier held `n` blocks at `now` (its peak and time integral)."""
        st = self.stats
        st.host_block_seconds += st._last_host * (now - st._last_t)
        st._last_t, st._last_host = now, n
        st.peak_host_blocks = max(st.peak_host_blocks, n)

    def _finish_step(self, sched: SchedulerOutput, forward_s: float) -> None:
        self.last_end = self.clock()
        self._track_host()
        tokens = [[SIM_TOKEN] if s.samples else [] for s in sched.scheduled]
        outputs = self.scheduler.update_from_output(sched, ModelRunnerOutput(tokens, forward_s))
        self._deliver(outputs)
        self._busy = False
        self._wake(now=True)

    def _finish_stretch(self, sched: SchedulerOutput, st: Stretch) -> None:
        finish(self, sched, st, SIM_TOKEN)  # no request finished, every first token was out
        self._busy = False
        self._wake(now=True)

    def awaits_first(self, request_id: str) -> bool:
        """True while a submitted request has not delivered its first token (or finish) yet."""
        p = self._pending.get(request_id)
        return p is not None and not p.got_first

    def mark_wait(self, when: float) -> None:
        """A step scheduled at `when` left nobody waiting, and nobody arrived since."""
        self._wait = WaitMark(self._wait.cause, 0, 0, 0, when)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        now = self.clock()
        for out in outputs:
            p = self._pending.get(out.request_id)
            if p is None:
                continue
            if not p.got_first and (out.new_token_ids or out.finished):
                p.got_first = True
                if p.on_first is not None:
                    p.on_first(now)
            if out.finished:
                del self._pending[out.request_id]
                s = p.seq
                p.on_done(out, s.block_hashes[:s.num_computed_tokens // self.cfg.block_size])
