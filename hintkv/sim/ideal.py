"""The bound no cache policy can pass: the same agents on a server that answers every call at once.

    bound_s = zero_serving_task_s(workload, block_size=16)   # mean task time, serving time zero

A task's time is its tools, its sub-agents' structure and its calls' serving time; a cache policy
can only shorten the last. `InstantEngine` takes the place of `SimEngine` under the real driver
(the same programs, hints, sleeps and sub-agent joins on the event clock) and finishes each call
at the instant it is sent, so the mean task time it gives is what any policy's task time tends to
as TTFT and decode go to zero: the report prints it beside the task goal (`run.goals`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hintkv.cache.hashing import namespace_root
from hintkv.engine.types import CacheEdit, EditOutcome, RequestOutput, SessionRef
from hintkv.sim.agents import ProgramDriver
from hintkv.sim.clock import EventClock
from hintkv.sim.cluster import SimCluster
from hintkv.workload.agent import HintPlan, workload_programs
from hintkv.workload.program import Workload


@dataclass(frozen=True, slots=True)
class _Cfg:
    block_size: int


class InstantEngine:
    """Answers each call at the instant it is sent: no queue, no prefill, no decode time."""

    def __init__(self, clock: EventClock, block_size: int) -> None:
        self.clock = clock
        self.cfg = _Cfg(block_size)
        self.root = namespace_root("sim", "sim", block_size, None)

    def submit(self, request_id: str, prompt: list[int], max_tokens: int, session: SessionRef | None,
               on_first: Callable[[float], None] | None, on_done: Callable[[RequestOutput, list], None],
               block_hashes: list | None = None) -> None:
        out = RequestOutput(request_id, [], True, "length", len(prompt), len(prompt), max_tokens)

        def done() -> None:
            if on_first is not None:
                on_first(self.clock())
            on_done(out, [])

        self.clock.after(0.0, done)

    def manage(self, ref: SessionRef, edits: list[CacheEdit]) -> list[EditOutcome]:
        return [EditOutcome("none", reason="instant") for _ in edits]


def zero_serving_spans(workload: Workload, block_size: int = 16, time_scale: float = 1.0) -> list:
    """Each task's span (`simulate.TaskSpan`) with every call served at the instant it is sent."""
    from hintkv.sim.simulate import task_spans, whole_program

    clock = EventClock()
    driver = ProgramDriver(SimCluster([InstantEngine(clock, block_size)]), hints=False,
                           time_scale=time_scale, blocks=False)
    driver.start(whole_program(workload_programs(workload, HintPlan(hints=False))))
    while clock.run_next():
        pass
    if len(driver.calls) != workload.num_calls or not driver.done:
        raise RuntimeError("the instant-server replay stopped early")
    return task_spans(driver.calls)


def zero_serving_task_s(workload: Workload, block_size: int = 16, time_scale: float = 1.0) -> float:
    """Mean task time (first call sent to last call done) with every call served instantly."""
    spans = zero_serving_spans(workload, block_size, time_scale)
    return sum(t.e2e_s for t in spans) / len(spans) if spans else 0.0
