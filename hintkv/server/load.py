"""Admission under load: refuse early and say when to retry, rather than queue without bound.

    generation request --tenant rate (token bucket)--> 429 + Retry-After
                       --tenant concurrency---------> 429 + Retry-After
                       --server in flight > cap-----> 503 + Retry-After
                       --> admitted (a `Ticket`, released when its response ends)

Management requests (`manage_request: true`), /health, /metrics and /v1/sessions/* never pass
through here: they stay fast however busy inference is. All of this runs on the event loop
(one thread), so plain counters need no lock. Per-tenant state is dropped once a tenant is idle
(bucket full, nothing in flight), so it is bounded by the tenants active in the last seconds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from hintkv.server.errors import overloaded

_PRUNE_AT = 4096  # tenant entries before idle ones are dropped


@dataclass(slots=True)
class _Tenant:
    tokens: float
    stamp: float
    in_flight: int = 0


class Ticket:
    """One admitted request; `release()` (idempotent) gives its slot back."""

    __slots__ = ("_gate", "_tenant", "_done")

    def __init__(self, gate: LoadGate, tenant: str) -> None:
        self._gate, self._tenant, self._done = gate, tenant, False

    def release(self) -> None:
        if not self._done:
            self._done = True
            self._gate._release(self._tenant)


class LoadGate:
    def __init__(self, max_in_flight: int, tenant_rate: float = 0.0, tenant_concurrency: int = 0,
                 clock=time.monotonic) -> None:
        self.max_in_flight = max_in_flight
        self.rate = tenant_rate
        self.burst = max(1.0, tenant_rate)
        self.tenant_concurrency = tenant_concurrency
        self.clock = clock
        self.in_flight = 0
        self.tenants: dict[str, _Tenant] = {}

    def admit(self, tenant: str) -> Ticket:
        """A ticket, or an `APIError` (429/503 with Retry-After); nothing is counted if refused."""
        now = self.clock()
        t = self.tenants.get(tenant)
        if t is None:
            if len(self.tenants) >= _PRUNE_AT:
                self._prune(now)
            t = self.tenants[tenant] = _Tenant(tokens=self.burst, stamp=now)
        if self.rate > 0:
            t.tokens = min(self.burst, t.tokens + (now - t.stamp) * self.rate)
            t.stamp = now
            if t.tokens < 1.0:
                wait = math.ceil((1.0 - t.tokens) / self.rate)
                raise overloaded(
                    f"This tenant is over its rate limit of {self.rate:g} requests/s.", wait, 429
                )
        if self.tenant_concurrency and t.in_flight >= self.tenant_concurrency:
            raise overloaded(
                f"This tenant already has {t.in_flight} requests in flight (the limit).", 1, 429
            )
        if self.in_flight >= self.max_in_flight:
            raise overloaded(
                f"The server is at capacity ({self.in_flight} requests in flight); retry shortly.", 1
            )
        if self.rate > 0:
            t.tokens -= 1.0
        t.in_flight += 1
        self.in_flight += 1
        return Ticket(self, tenant)

    def _release(self, tenant: str) -> None:
        self.in_flight -= 1
        t = self.tenants.get(tenant)
        if t is not None:
            t.in_flight -= 1

    def _prune(self, now: float) -> None:
        def refilled(t: _Tenant) -> bool:
            return self.rate <= 0 or t.tokens + (now - t.stamp) * self.rate >= self.burst

        idle = [k for k, t in self.tenants.items() if t.in_flight == 0 and refilled(t)]
        for k in idle:
            del self.tenants[k]

    def check_integrity(self) -> None:
        assert self.in_flight == sum(t.in_flight for t in self.tenants.values()) >= 0
        assert all(t.in_flight >= 0 for t in self.tenants.values())
