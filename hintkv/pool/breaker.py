"""A circuit breaker with exponential back-off for calls to a remote pool.

    closed ──failure × threshold──▶ open ──back-off elapsed──▶ half-open (one probe)
       ▲                              ▲                             │
       └────────── probe succeeds ────┼──────── probe fails ────────┘ (back-off doubles)

While open, callers skip the pool at once (a miss, a refused put): serving continues from the
local tiers and recomputes; nothing waits on a dead master. The breaker never closes by itself:
a successful probe closes it, so the pool comes back when the master does.
"""

from __future__ import annotations

import threading
import time


class CircuitBreaker:
    def __init__(self, threshold: int = 2, base_backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, clock=time.monotonic) -> None:
        self.threshold = threshold
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0  # consecutive failures while closed
        self._backoff = base_backoff_s
        self._open_until: float | None = None  # None: closed
        self._probing = False
        self.num_opened = 0  # times the breaker opened (monotonic)
        self.num_recovered = 0  # times a probe closed it again

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._open_until is not None

    def allow(self) -> bool:
        """May a call go to the pool now? When open and the back-off has elapsed, exactly one
        caller gets True (the probe); it must report `success()` or `failure()`."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._probing or self._clock() < self._open_until:
                return False
            self._probing = True
            return True

    def success(self) -> bool:
        """Record a good call; True if it closed an open breaker (the pool came back)."""
        with self._lock:
            self._failures = 0
            if self._open_until is None:
                return False
            self._open_until, self._probing = None, False
            self._backoff = self.base_backoff_s
            self.num_recovered += 1
            return True

    def failure(self) -> None:
        with self._lock:
            if self._open_until is not None:  # the probe failed: wait longer
                self._probing = False
                self._backoff = min(self.max_backoff_s, self._backoff * 2)
                self._open_until = self._clock() + self._backoff
                return
            self._failures += 1
            if self._failures >= self.threshold:
                self._open_until = self._clock() + self._backoff
                self.num_opened += 1
