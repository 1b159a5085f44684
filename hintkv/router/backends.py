"""The instances behind the router: health, load, and counters per backend.

A backend is *up* until a request to it fails to connect, a health check (`GET /health`, every
`interval_s`) finds nothing listening, or `down_after` checks in a row fail or time out (a busy
instance answers slowly, it is not dead); it is up again after a good health check.
Load is the number of requests the router has in flight to it (what it knows without asking).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

log = logging.getLogger(__name__)

MAX_OWED = 1024  # evicts kept per down backend (the oldest go first: the idle expiry ends those)


@dataclass(slots=True)
class Backend:
    url: str  # http://host:port (no trailing slash)
    up: bool = True
    inflight: int = 0  # requests the router is forwarding to it now
    num_requests: int = 0  # forwarded (monotonic, like every num_ below)
    num_errors: int = 0  # connection failures and timeouts
    num_failovers: int = 0  # requests moved away from it after a failure
    num_health_failures: int = 0
    num_failed_checks: int = 0  # consecutive failed health checks (not counting refusals)
    num_sessions: int = 0  # sessions placed on it now
    status_counts: dict[int, int] = field(default_factory=dict)  # replies by HTTP status
    # evicts it missed while down (path, body, headers), sent when a health check finds it up again
    owed: deque = field(default_factory=lambda: deque(maxlen=MAX_OWED))


class Backends:
    def __init__(self, urls: list[str], interval_s: float = 1.0, timeout_s: float = 5.0,
                 down_after: int = 3) -> None:
        if not urls:
            raise ValueError("the router needs at least one --backend")
        self.backends = {u.rstrip("/"): Backend(u.rstrip("/")) for u in urls}
        if len(self.backends) != len(urls):
            raise ValueError("a backend is listed twice")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.down_after = down_after  # consecutive slow / failed checks before a backend is down
        self.on_up: Callable[[Backend], None] | None = None  # a backend is up again
        self._task: asyncio.Task | None = None

    def __getitem__(self, url: str) -> Backend:
        return self.backends[url]

    def healthy(self) -> list[Backend]:
        return [b for b in self.backends.values() if b.up]

    def mark_down(self, b: Backend, why: str) -> None:
        if b.up:
            log.warning("router: backend %s is down (%s)", b.url, why)
        b.up = False
        b.num_errors += 1

    async def check(self, client: httpx.AsyncClient) -> None:
        """One round of health checks, all backends at once."""
        async def one(b: Backend) -> None:
            refused = False
            try:
                r = await client.get(f"{b.url}/health", timeout=self.timeout_s)
                ok = r.status_code == 200
            except httpx.ConnectError:  # nothing listens: down now
                ok, refused = False, True
            except httpx.HTTPError:  # slow or erroring: down after a few in a row
                ok = False
            if ok:
                was_up = b.up
                if not was_up:
                    log.info("router: backend %s is up again", b.url)
                b.up, b.num_failed_checks = True, 0
                if (not was_up or b.owed) and self.on_up is not None:
                    self.on_up(b)  # starts its own task: a slow instance never holds up the checks
                return
            b.num_health_failures += 1
            b.num_failed_checks += 1
            if refused or b.num_failed_checks >= self.down_after:
                if b.up:
                    log.warning("router: backend %s failed its health checks", b.url)
                b.up = False
        await asyncio.gather(*(one(b) for b in self.backends.values()))

    async def run_checks(self, client: httpx.AsyncClient) -> None:
        while True:
            await self.check(client)
            await asyncio.sleep(self.interval_s)

    def metrics_text(self) -> str:
        """Per-backend figures in the Prometheus text format."""
        lines = []
        for name, help_, kind, get in (
            ("hintkv_router_backend_up", "1 if the backend is healthy", "gauge", lambda b: int(b.up)),
            ("hintkv_router_backend_inflight", "requests in flight", "gauge", lambda b: b.inflight),
            ("hintkv_router_backend_sessions", "sessions placed", "gauge", lambda b: b.num_sessions),
            ("hintkv_router_backend_requests_total", "requests forwarded", "counter",
             lambda b: b.num_requests),
            ("hintkv_router_backend_errors_total", "connection failures and timeouts", "counter",
             lambda b: b.num_errors),
            ("hintkv_router_backend_failovers_total", "requests moved away after a failure",
             "counter", lambda b: b.num_failovers),
            ("hintkv_router_backend_health_failures_total", "failed health checks", "counter",
             lambda b: b.num_health_failures),
        ):
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            lines += [f'{name}{{backend="{b.url}"}} {get(b)}' for b in self.backends.values()]
        name = "hintkv_router_backend_responses_total"
        lines += [f"# HELP {name} replies by HTTP status", f"# TYPE {name} counter"]
        for b in self.backends.values():
            lines += [f'{name}{{backend="{b.url}",status="{s}"}} {n}'
                      for s, n in sorted(b.status_counts.items())]
        return "\n".join(lines) + "\n"
