"""What every route handler needs, held once on the app: the engine, the keys, the metrics,
and whether Agent Hints are acted on; plus the caller's tenant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request

from hintkv.server.auth import authenticate, tenant_of
from hintkv.server.metrics import ServerMetrics


@dataclass(slots=True)
class ServerState:
    engine: Any  # hintkv.engine.async_llm.AsyncLLM (typed loosely: the server never builds one)
    api_keys: tuple[str, ...]  # empty: no authentication
    metrics: ServerMetrics
    hints: bool = True  # False (--ignore-hints): hints are validated but never reach the engine


def server_state(request: Request) -> ServerState:
    return request.app.state.hintkv


def require_api_key(request: Request) -> str | None:
    """FastAPI dependency of every /v1 route: the caller's key, or a 401."""
    key = authenticate(request, server_state(request).api_keys)
    request.state.api_key = key
    return key


def request_tenant(request: Request, cache_salt: str | None) -> str:
    """The tenant of an authenticated request (after `require_api_key`) in namespace `cache_salt`."""
    return tenant_of(getattr(request.state, "api_key", None), cache_salt)
