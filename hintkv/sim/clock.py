"""The discrete-event clock: simulated seconds, and callbacks due at given times.

    clock = EventClock()
    clock.at(2.5, lambda: print("tool returned"))   # or clock.after(dt, fn)
    while clock.run_next(): ...                     # advance to each event in time order
    clock.wait_for(future.done, clock() + 0.05)     # inside an event: block it in simulated time

`clock()` (the instance is callable) is the current simulated time, so it plugs in wherever the
real code takes a `clock` (scheduler, SAM, policies). Events due at the same time run in the order
they were scheduled (a sequence number breaks ties), so a run is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


class EventClock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._queue: list[tuple[float, int, Callable[[], None], object]] = []
        self._waiters: dict[object, Callable[[], None]] = {}  # owner -> run after its next event
        self._seq = 0
        self.num_events = 0
        self._waiting = False  # a wait_for is running events (a nested one does not wait)
        self.num_waits = 0  # wait_for calls that waited (the load had not landed)
        self.nested_waits_declined = 0  # wait_for calls inside another wait: not waited (wait_for)

    def __call__(self) -> float:
        return self.now

    def at(self, t: float, fn: Callable[[], None], owner: object = None) -> None:
        """`owner`: whose event this is (an instance's mover): see `wait`."""
        if t < self.now:
            raise ValueError(f"cannot schedule in the past ({t} < {self.now})")
        heapq.heappush(self._queue, (t, self._seq, fn, owner))
        self._seq += 1

    def after(self, dt: float, fn: Callable[[], None], owner: object = None) -> None:
        self.at(self.now + max(0.0, dt), fn, owner)

    def wait(self, owner: object, fn: Callable[[], None]) -> None:
        """Run `fn` right after the next event of `owner` (an engine waiting on its own copies:
        with many instances on one clock, re-checking at every event of every instance made
        instances waiting on each other's re-checks spin at one instant)."""
        self._waiters[owner] = fn

    def unwait(self, owner: object) -> bool:
        return self._waiters.pop(owner, None) is not None

    def next_time(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def __len__(self) -> int:
        return len(self._queue)

    def run_next(self) -> bool:
        """Advance to the earliest event and run it; False when none is left."""
        if not self._queue:
            return False
        t, _, fn, owner = heapq.heappop(self._queue)
        self.now = t
        self.num_events += 1
        fn()
        if owner is not None and (w := self._waiters.pop(owner, None)) is not None:
            w()
        return True

    def wait_for(self, done: Callable[[], bool], until: float) -> bool:
        """Block the caller in simulated time: run events in time order until `done()` or `until`
        passes (a step waiting inside `schedule()` for its load: `Mover.wait_done`); True: done.

        Only one wait runs at a time. A wait asked for inside another one (instance B's step, run by
        instance A's wait, waiting for B's own load) does not wait: it returns `done()` at once, so
        B's load lands and is picked up by a later step of B (next-step timing for that step), and
        A's wait, with nothing nested in it that runs events, ends exactly when A's load lands or
        its limit passes. Live instances are separate processes and both would wait; exact nesting
        needs steps as coroutines. `nested_waits_declined` counts the waits declined, `num_waits`
        the ones that waited, so a report shows how often the approximation applied."""
        if done():
            return True
        if self._waiting:
            self.nested_waits_declined += 1
            return False
        self.num_waits += 1
        self._waiting = True
        try:
            while not done() and self._queue and self._queue[0][0] <= until:
                self.run_next()
        finally:
            self._waiting = False
        if not done():
            self.now = max(self.now, until)
        return done()

    def run_until(self, t: float) -> None:
        """Run every event due at or before `t`, then stand at `t`."""
        while self._queue and self._queue[0][0] <= t:
            self.run_next()
        self.now = max(self.now, t)
