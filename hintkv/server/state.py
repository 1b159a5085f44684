"""What every route handler needs, held once on the app: the engine, the options (keys,
limits), the load gate, the metrics, and whether Agent Hints are acted on; plus the caller's
tenant."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import Request

from hintkv.engine.client import EngineClient
from hintkv.server.auth import authenticate, tenant_of
from hintkv.server.limits import RequestLimits
from hintkv.server.load import LoadGate
from hintkv.server.metrics import ServerMetrics
from hintkv.server.options import ServerOptions


@dataclass(slots=True)
class ServerState:
    engine: EngineClient  # the server never builds one, and never reaches behind it
    options: ServerOptions
    metrics: ServerMetrics
    gate: LoadGate
    hints: bool = True  # False (--ignore-hints): hints are validated but never reach the engine
    # Tokenising large prompts, and management calls, each in their own threads: a flood of one
    # never queues the other, and neither blocks the event loop.
    cpu_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="hintkv-tokenize")
    )
    manage_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="hintkv-manage")
    )

    @property
    def api_keys(self) -> tuple[str, ...]:  # empty: no authentication
        return self.options.api_keys

    @property
    def limits(self) -> RequestLimits:
        return self.options.limits


def server_state(request: Request) -> ServerState:
    return request.app.state.hintkv


def _check_api_key(request: Request) -> str | None:
    key = authenticate(request, server_state(request).api_keys)
    request.state.api_key = key
    return key


# The dependencies are coroutines: FastAPI runs a plain `def` dependency in its worker threads, a hop out of the
# event loop and back (two thread wake-ups, each maybe on a halted vCPU) for a check of microseconds, on every request.
async def require_api_key(request: Request) -> str | None:
    """FastAPI dependency of every /v1 route: the caller's key, or a 401."""
    return _check_api_key(request)


async def require_metrics_access(request: Request) -> None:
    """/metrics needs a key like every route, unless the operator made it public."""
    if not server_state(request).options.public_metrics:
        _check_api_key(request)


def request_tenant(request: Request, cache_salt: str | None) -> str:
    """The tenant of an authenticated request (after `require_api_key`) in namespace `cache_salt`."""
    return tenant_of(getattr(request.state, "api_key", None), cache_salt)
