"""A discrete-event driver for agent programs: virtual time, no threads, deterministic.

    loop = EventLoop(time_scale=1.0)
    loop.start(workload_programs(workload, plan), on_send=server.send, on_manage=server.manage)
    loop.run()      # until every program ended; loop.now is the virtual end time

A program's `Sleep` and `Run` delays advance virtual time (trace seconds / `time_scale`). A
`Send` is handed to `on_send(loop, send, done)`, which must call `done(result)` exactly once,
now or later (`loop.at(t, fn)`); a `Manage` to `on_manage(loop, manage)`, which returns at once.
Events at equal times run in the order they were scheduled, so a run is a pure function of its
inputs. The offline replay (`hintkv.replay.offline`) and the simulator drive the same programs
as the live driver does.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from hintkv.workload.agent import Manage, Program, Run, Send, Sleep

OnSend = Callable[["EventLoop", Send, Callable[[Any], None]], None]
OnManage = Callable[["EventLoop", Manage], Any]


class EventLoop:
    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.time_scale = time_scale
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.on_send: OnSend | None = None
        self.on_manage: OnManage | None = None
        self.num_live = 0  # programs started and not ended

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn))

    def start(self, root: Run, on_send: OnSend, on_manage: OnManage) -> None:
        self.on_send, self.on_manage = on_send, on_manage
        self._run(root, lambda _: None)

    def run(self, until: float | None = None) -> None:
        while self._heap and (until is None or self._heap[0][0] <= until):
            t, _, fn = heapq.heappop(self._heap)
            self.now = t
            fn()

    # ---- programs --------------------------------------------------------------------------
    def _spawn(self, program: Program, on_end: Callable[[Any], None]) -> None:
        self.num_live += 1

        def end(_: Any) -> None:
            self.num_live -= 1
            on_end(None)

        self._step(program, None, end)

    def _step(self, program: Program, value: Any, on_end: Callable[[Any], None]) -> None:
        while True:
            try:
                effect = program.send(value)
            except StopIteration:
                on_end(None)
                return
            if isinstance(effect, Manage):
                value = self.on_manage(self, effect)
                continue
            self._wait(effect, lambda v: self._step(program, v, on_end))
            return

    def _wait(self, effect: Any, resume: Callable[[Any], None]) -> None:
        if isinstance(effect, Sleep):
            self.at(self.now + effect.seconds / self.time_scale, lambda: resume(None))
        elif isinstance(effect, Send):
            self.on_send(self, effect, lambda r: self.at(self.now, lambda: resume(r)))
        elif isinstance(effect, Run):
            self._run(effect, resume)
        else:
            raise TypeError(f"unknown effect {effect!r}")

    def _run(self, run: Run, resume: Callable[[Any], None]) -> None:
        pending = [len(run.children) + 1]

        def one_done(_: Any) -> None:
            pending[0] -= 1
            if pending[0] == 0:
                resume(None)

        for delay, child in run.children:
            self.at(self.now + delay / self.time_scale, lambda c=child: self._spawn(c, one_done))
        self.at(self.now + run.at_least_s / self.time_scale, lambda: one_done(None))
