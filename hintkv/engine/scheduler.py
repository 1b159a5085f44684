"""The scheduler: owns the requests, the KV manager and the session bookkeeping; no tensors.

One engine step is `schedule()` -> the model runner -> `update_from_output()`:

- `schedule()` does the step's housekeeping (landed tier loads, predicted resumes), then batches:
  running sequences first (decodes and unfinished prefill chunks, in the admission policy's
  order: FCFS for `fcfs`), preempting the last running sequence when blocks run out (its KV is
  freed and recomputed later); then waiting sequences in the policy's order while budget,
  sequence slots and blocks allow. A policy may have a running prefill yield to a better waiting
  candidate or take only part of its chunk (`short-first`); what the admissions leave goes back
  to those prefills. Each transition adds to the request's TTFT parts (`engine.ttft`). The two
  passes are `engine.batching`.
- `update_from_output()` (`engine.step_update`) takes what the runner sampled: advances each
  sequence over the KV it computed, commits newly full blocks to the prefix index, appends the
  tokens, checks stop conditions, and finishes sequences (their session now holds their blocks).

Nothing here reads a tensor or the wall clock directly: time comes from `clock` (default
`time.monotonic`), so a simulator can drive the real scheduler with made-up runner output
under a virtual clock. A driver's step, as `LLMEngine.step` does it:

    out = scheduler.schedule(unlocked)  # under the driver's state lock; `unlocked`: see below
    scheduler.kv.flush_write_downs()    # with tiers: copy down the victims this pass reuses
    runner_out = <run out.scheduled>    # ModelRunnerOutput: token ids per scheduled sequence
    outputs = scheduler.update_from_output(out, runner_out)

The driver's two duties, and what is checked of them:
- flush before the forward pass: a block the pool handed out may still hold a victim queued for a
  write-down (`cache.write_downs` states it); `schedule()` records the queue's mark on its
  output. `check_flushed(out)` raises if no flush reached it: `LLMEngine.step` calls it just
  before its forward pass (a late flush there is refused), `update_from_output` calls it again
  for every driver (this catches a missing flush, not a late one: a driver that flushes after
  its forward passes it, so a driver that writes device KV must call `check_flushed` first).
- `unlocked` (optional): a context manager in which the step's load waits run (`same-step`
  load timing); `LLMEngine` passes one that releases its state lock, so the server's locked
  reads (`manage`, `describe_session`, `/metrics`' tier stats) never wait for a copy. Inside
  it only other threads' lock holders may touch the state, and whatever they change is what
  they may change during a forward pass (edits, reads, sweeps); what the step does after the
  wait re-checks its room. Requests are added and aborted between steps (on the engine's
  thread: the async wrapper routes them there): `add_request` / `abort_request` raise while a
  step is inside its wait, since the step still holds the indices and blocks it scheduled.

A sequence whose prefix continues in a lower tier (host, disk) is admitted with blocks for it
and set aside as LOADING while the blocks arrive; it takes no token budget, and the sequences
behind it keep being admitted and run. Each step first moves the loads that have landed (or
timed out) to running, advanced over the blocks that arrived.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from concurrent.futures import Future

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.resume_prefetch import make_resume_prefetch
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry, session_key
from hintkv.cache.types import CacheEdit, EditOutcome, SessionDescription, SessionRef
from hintkv.config import EngineConfig
from hintkv.engine import batching, room_wait, step_update, ttft
from hintkv.engine.admission import AdmissionPolicy, make_admission
from hintkv.engine.load_timing import make_load_timing
from hintkv.engine.outputs import ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from hintkv.engine.request_metrics import request_metrics
from hintkv.engine.sequence import SeqStatus, Sequence
from hintkv.engine.spec.proposer import Proposer
from hintkv.engine.types import FinishReason, RequestMetrics, RequestOutput

__all__ = ["ModelRunnerOutput", "ScheduledSeq", "Scheduler", "SchedulerOutput"]

Clock = Callable[[], float]
QUEUE_TENANT = "\x00queued"  # transient sessions of queued requests (qlru); no API tenant has it


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int, *,
                 sam: SessionAwareManager | None = None, hints: bool = True,
                 eos_token_ids: Iterable[int] = (),
                 max_model_len: int | None = None, clock: Clock = time.monotonic,
                 admission: AdmissionPolicy | str = "fcfs", load_timing: str = "next-step") -> None:
        self.kv = kv
        self.load_timing = make_load_timing(load_timing)  # when a lower-tier hit computes
        self.admission = (make_admission(admission, max_model_len=max_model_len)
                          if isinstance(admission, str) else admission)
        self.sam = sam
        if hints and sam is not None and self.admission.attach_returns(self.next_return):  # (srpt-resume)
            sam.track_returns = True
        self.admission.attach_landings(self.next_landing)  # (srpt-land)
        # Session identity and edits are acted on (False: --ignore-hints; SAM then only ranks).
        self.hints = hints and sam is not None
        # qlru with hints off: each queued request's prompt is a transient session (policies.qlru)
        self.queue_sessions = sam is not None and not self.hints and getattr(kv.pool.policy, "wants_queue", False)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.clock = clock
        self.requests: dict[str, Sequence] = {}  # every sequence not finished yet, by request id
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.loading: list[Sequence] = []  # admitted, waiting for prefix KV from a lower tier
        self.num_preemptions = 0
        self.num_prompt_tokens = 0  # prompt tokens of added requests
        self.num_prompt_tokens_computed = 0  # prompt tokens run through the model (incl. recomputes)
        self.proposer: Proposer | None = None  # speculative decoding: drafts for decoding sequences
        self.spec_max_rows = 16  # the most rows (real tokens + drafts) a step with drafts runs
        self.num_draft_tokens = 0  # drafts verified
        self.num_accepted_tokens = 0  # of which accepted
        self._in_load_wait = False  # schedule() is inside `unlocked` (add/abort refused)

    @classmethod
    def from_config(cls, cfg: EngineConfig, num_blocks: int, *, eos_token_ids: Iterable[int] = (),
                    max_model_len: int | None = None, clock: Clock = time.monotonic) -> Scheduler:
        """The whole cache stack of `cfg` (sessions, policy, KV manager, SAM) under a scheduler;
        no model, no tiers (attach those with `kv.tiers`)."""
        sessions = SessionRegistry(protect_budget_blocks=int(cfg.protect_budget * num_blocks))
        policy = make_policy(cfg.eviction_policy, sessions=sessions, clock=clock)
        kv = KVCacheManager(num_blocks, cfg.block_size, policy)
        kv.ranking.clock = clock
        sam = SessionAwareManager(kv, sessions, clock=clock)
        sam.predict_resume = cfg.hints
        sam.resume = make_resume_prefetch(cfg.resume_prefetch)
        return cls(kv, cfg.max_num_seqs, cfg.max_num_batched_tokens, sam=sam, hints=cfg.hints,
                   eos_token_ids=eos_token_ids, max_model_len=max_model_len, clock=clock,
                   admission=cfg.scheduling_policy, load_timing=cfg.load_timing)

    @property
    def sessions(self) -> SessionRegistry | None:
        return None if self.sam is None else self.sam.sessions

    # ---- requests in and out ---------------------------------------------------------------
    def _between_steps(self, what: str) -> None:
        if self._in_load_wait:
            raise RuntimeError(
                f"{what} while a step waits for a same-step load with the state lock released: "
                "requests are added and aborted between steps, on the engine's thread "
                "(hintkv.engine.scheduler)")

    @contextmanager
    def _load_wait(self, unlocked: Callable[[], AbstractContextManager] | None) -> Iterator[None]:
        """A load wait inside schedule(): `unlocked` (the driver's lock released), add/abort refused."""
        self._in_load_wait = True  # set and cleared while the driver holds its lock
        try:
            with (unlocked or nullcontext)():
                yield
        finally:
            self._in_load_wait = False

    def add_request(self, seq: Sequence) -> None:
        self._between_steps(f"add_request({seq.request_id!r})")
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already running")
        if seq.session is not None and self.hints:
            seq.session_key = self.sam.on_arrival(seq.session, seq.session.tool)
        seq.arrival = self.clock()
        ttft.arrived(seq)
        if self.queue_sessions:
            self._hold_queued(seq)
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)
        self.num_prompt_tokens += seq.num_prompt_tokens

    def _hold_queued(self, seq: Sequence) -> None:
        ref = SessionRef(QUEUE_TENANT, seq.request_id, seq.request_id)
        hashes = self.kv.update_hashes(seq, seq.num_tokens - 1)
        self.sam.on_done(self.sam.on_arrival(ref), list(hashes))

    def release_queued(self, seq: Sequence) -> None:
        if self.queue_sessions:
            self.sam.sessions.end(session_key(QUEUE_TENANT, seq.request_id))

    def abort_request(self, request_id: str) -> RequestMetrics | None:
        """Drop a request wherever it is (its session keeps what it computed): its figures so far (a stop
        string's end is an abort: the server observes them), None if it is unknown (finished)."""
        self._between_steps(f"abort_request({request_id!r})")
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        return self.finish(seq, "abort").metrics

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    def finish(self, seq: Sequence, reason: FinishReason) -> RequestOutput:
        """A sequence leaves: its session now holds its computed blocks; its block refs go."""
        seq.finish_reason = reason
        if seq.session_key is not None and self.sam is not None:
            if seq.status is SeqStatus.WAITING:
                room_wait.note_left_queued(self, seq, self.clock())
            bs = self.kv.block_size
            self.sam.on_done(seq.session_key, seq.block_hashes[:seq.num_computed_tokens // bs])
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.LOADING:
            self.loading.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
            self.release_queued(seq)
        if reason == "abort" and seq.status in (SeqStatus.RUNNING, SeqStatus.LOADING):
            room_wait.note_left_early(self, seq, self.clock())
        self.kv.free(seq)
        if self.proposer is not None:
            self.proposer.on_finish(seq)
        seq.status = SeqStatus.FINISHED
        self.requests.pop(seq.request_id, None)
        self.admission.forget(seq.request_id)
        return step_update.request_output(seq, finished=True, metrics=request_metrics(seq, self.clock()))

    def preempt(self, seq: Sequence) -> None:
        ttft.preempted(seq, self.clock())
        room_wait.note_left_early(self, seq, self.clock())
        if seq.session_key is not None and self.hints:  # its session holds what it computed:
            bs = self.kv.block_size                     # written down if evicted, loaded back
            self.sam.sessions.hold(seq.session_key, seq.block_hashes[:seq.num_computed_tokens // bs])
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        if self.queue_sessions:
            self._hold_queued(seq)

    def others_hold_blocks(self) -> bool:
        """Blocks will come free without finishing anyone: loads or prefetches in flight."""
        return bool(self.loading) or self.kv.num_prefetching_blocks > 0

    # ---- schedule --------------------------------------------------------------------------
    def schedule(self, unlocked: Callable[[], AbstractContextManager] | None = None) -> SchedulerOutput:
        """One step's batch; `unlocked`: what the step's load waits run in (the module's docstring)."""
        now = self.clock()
        out = SchedulerOutput(started=now)
        if self.sam is not None:
            self.sam.on_step(now)  # re-rank by the clock; predicted resumes
        if self.kv.tiers is not None:
            self.kv.tiers.poll()  # publish class changes to the tiers; land prefetches
        budget = self.max_num_batched_tokens
        for seq in [s for s in self.loading if self.kv.load_ready(s)]:
            self.kv.finish_load(seq)
            ttft.loaded(seq, now)
            self.loading.remove(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
        self.admission.order_running(self.running, budget)
        if self.admission.swaps and self.waiting:
            batching.make_room(self)  # decodes set aside for a new prefill (the swapping policies)
        capped: list[ScheduledSeq] = []  # running prefills that left part of their chunk to others
        budget, i = batching.schedule_running(self, out, budget, 0, capped)
        if not out.preempted:
            yielded = len(self.running) - i  # prefills behind a better waiting candidate (or no budget)
            loads = len(self.loading)
            budget = batching.admit_waiting(self, out, budget, at=i)
            if len(self.loading) > loads:  # loads this step started: computed now if they land,
                # running after the admissions and before the prefills that yielded
                budget = batching.land_new_loads(self, out, budget, self.loading[loads:],
                                                 at=len(self.running) - yielded,
                                                 unlocked=lambda: self._load_wait(unlocked))
            for s in capped:  # what the admissions left goes back to the capped prefills
                done = s.seq.num_computed_tokens
                # asked with what the step can still give (so the step's other tokens are what is used): a policy
                # that cuts (srpt-resume) sees a chunk that does not finish its prompt, not the whole rest, which
                # it would leave uncut
                extra = min(batching.chunk(self, s.seq, done, s.num_new_tokens + budget) - s.num_new_tokens, budget)
                if (extra > 0 and not self.admission.holds(s.seq, s.num_new_tokens + extra, out, done)
                        and self.kv.can_append(s.seq, s.num_new_tokens + extra)):
                    s.num_new_tokens += extra
                    batching.grow_kv(self.kv, s.seq, s.num_new_tokens)
                    budget -= extra
            if yielded and budget > 0:  # and then to the prefills that yielded
                budget, _ = batching.schedule_running(self, out, budget, len(self.running) - yielded, None)
        batching.add_drafts(self, out, budget)  # from what the real tokens left
        if self.kv.tiers is not None:  # the driver flushes up to here before the forward pass
            out.write_down_mark = self.kv.tiers.write_downs.mark()
        return out

    def next_return(self) -> tuple[float, float]:
        """(seconds until SAM predicts the next call of a session away on its tool, the engine's
        prefill seconds a token; 0.0 without tiers, which keep that cost): `srpt-resume`'s."""
        now = self.clock()
        token_s = self.kv.tiers.costs.prefill_s_per_token if self.kv.tiers is not None else 0.0
        return self.sam.next_return(now) - now, token_s

    def next_landing(self) -> float:
        """Seconds until a request's load in flight is expected to have landed (inf: none, or no
        tiers; `TierLoads.next_landing_s`): `srpt-land`'s. Engine knowledge: no hints needed."""
        tiers = self.kv.tiers  # (set after construction by the server and the simulator)
        return tiers.next_landing_s() if tiers is not None and self.loading else math.inf

    def check_flushed(self, out: SchedulerOutput) -> None:
        """Raise unless a flush reached `out`'s write-down mark (call it before the forward pass)."""
        if self.kv.tiers is not None and out.scheduled:
            self.kv.tiers.write_downs.check_flushed(out.write_down_mark)

    # ---- update (hintkv.engine.step_update) ------------------------------------------------
    def update_from_output(self, sched: SchedulerOutput,
                           runner: ModelRunnerOutput) -> list[RequestOutput]:
        """Apply one step's results; returns what each touched request produced
        (`hintkv.engine.step_update`)."""
        return step_update.update_from_output(self, sched, runner)

    # ---- tiers: waiting for loads while idle -----------------------------------------------
    def pending_loads(self) -> list[Future[bool]]:
        """Tier reads still in flight (loads and prefetches); empty without tiers."""
        return [] if self.kv.tiers is None else self.kv.tiers.pending_futures()

    def wait_for_loads(self, pending: list[Future[bool]], timeout_s: float) -> None:
        """Block until `pending` land or `timeout_s` passes (call it without the state lock)."""
        if pending and self.kv.tiers is not None:
            self.kv.tiers.wait_for_loads(pending, timeout_s)

    # ---- sessions --------------------------------------------------------------------------
    def manage(self, ref: SessionRef, edits: list[CacheEdit]) -> list[EditOutcome]:
        if not self.hints:
            return [EditOutcome("none", reason="hints_ignored") for _ in edits]
        return [self.sam.apply(ref, e) for e in edits]

    def describe_session(self, tenant: str, session_id: str) -> SessionDescription | None:
        return None if self.sam is None else self.sam.describe(tenant, session_id)

    # ---- invariants ------------------------------------------------------------------------
    def check_integrity(self) -> None:
        self.kv.check_integrity()
        if self.sam is not None:
            self.sam.sessions.check_integrity()
        live = {b.block_id for s in [*self.running, *self.loading] for b in s.block_table}
        if self.kv.tiers is not None:
            live |= {b.block_id for b in self.kv.tiers.prefetching_blocks()}
        in_use = {b.block_id for b in self.kv.pool.blocks if b.ref_cnt > 0}
        assert live == in_use, "blocks in use that no running sequence holds"
        queued = {*map(id, self.waiting), *map(id, self.running), *map(id, self.loading)}
        assert queued == set(map(id, self.requests.values())), "a request in no queue, or twice"
        assert all(s.status is not SeqStatus.FINISHED for s in self.requests.values())

