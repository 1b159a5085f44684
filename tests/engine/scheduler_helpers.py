"""Helpers for scheduler-level tests: 4-token blocks, a namespace, a greedy sequence (of a session or none),
blocks stored on a tier stack (the payload of block i is filled with i + 1), and a real scheduler with SAM
and a KV manager on an event clock, stepped with made-up runner output (no model)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.types import SessionRef
from hintkv.engine.outputs import ModelRunnerOutput, SchedulerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import RequestOutput, SamplingParams
from hintkv.sim.clock import EventClock

BS = 4
ROOT = namespace_root("test", "float32", BS, None)


def seq_of(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, tokens, len(tokens), SamplingParams(temperature=0, max_tokens=2), ROOT)


def session_seq(rid: str, sid: str | None, tokens: list[int], max_tokens: int) -> Sequence:
    """A greedy sequence of session `sid` (tenant "t"; None: no session)."""
    return Sequence(rid, tokens, len(tokens), SamplingParams(temperature=0, max_tokens=max_tokens), ROOT,
                    session=None if sid is None else SessionRef("t", sid, sid))


def sam_scheduler(num_blocks: int, max_num_seqs: int, budget: int = 64, **kw):
    """(clock, sessions, kv, scheduler): a `num_blocks`-block sam KV manager, SAM, on an event clock;
    `kw` goes to `Scheduler` (admission, hints)."""
    clock = EventClock()
    sessions = SessionRegistry()
    kv = KVCacheManager(num_blocks, BS, make_policy("sam", sessions=sessions))
    sch = Scheduler(kv, max_num_seqs, budget, sam=SessionAwareManager(kv, sessions, clock=clock), clock=clock, **kw)
    return clock, sessions, kv, sch


def run_step(sch: Scheduler, forward: Callable[[SchedulerOutput], None] | None = None
             ) -> tuple[SchedulerOutput, list[RequestOutput]]:
    """One step as a driver runs it: schedule, flush the write-downs (with tiers), the forward (`forward`:
    e.g. advance the clock by the step's price), then every sampling row gives token 7."""
    out = sch.schedule()
    if sch.kv.tiers is not None:
        sch.kv.flush_write_downs()
    if forward is not None:
        forward(out)
    return out, sch.update_from_output(out, ModelRunnerOutput.from_tokens([7 if s.samples else None
                                                                            for s in out.scheduled]))


def store_blocks(stack, io, tokens: list[int], num_blocks: int) -> list[torch.Tensor]:
    hashes = hash_blocks(ROOT, tokens, BS)[:num_blocks]
    payloads = [torch.full(io.layout.shape, float(i + 1)) for i in range(num_blocks)]
    assert all(f.result() for f in stack.store(list(zip(hashes, payloads))))
    stack.flush()
    return payloads
