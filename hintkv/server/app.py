"""The FastAPI application: routes, error handlers, request metrics, around one engine.

`build_app` takes an engine that is already running and does not own it: whoever built the
engine shuts it down (see `hintkv.server.launch`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hintkv import __version__
from hintkv.engine.client import EngineClient
from hintkv.server import routes_chat, routes_completions, routes_info, routes_sessions
from hintkv.server.errors import CatchAll, install_error_handlers
from hintkv.server.load import LoadGate
from hintkv.server.metrics import ServerMetrics
from hintkv.server.options import ServerOptions
from hintkv.server.state import ServerState

logger = logging.getLogger(__name__)

ENDPOINTS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"}
)
SESSIONS_PREFIX = "/v1/sessions/"


def _endpoint_label(path: str) -> str:
    """A bounded label: session ids never become label values."""
    if path in ENDPOINTS:
        return path
    return "/v1/sessions/{id}" if path.startswith(SESSIONS_PREFIX) else "other"


class RequestCounter:
    """ASGI middleware counting responses by endpoint and status (streams are never buffered)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # if the app raises before answering, the error middleware sends a 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            endpoint = _endpoint_label(scope["path"])
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()


SESSION_SWEEP_INTERVAL_S = 1.0


def _upkeep(engine: EngineClient, integrity_interval: float):
    """The app's lifespan: while it serves, forget stale sessions every second (bounded state)
    and check the cache's integrity every `integrity_interval` s (0: never)."""

    async def every(interval: float, job) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await job()
            except Exception:  # upkeep must never stop serving; the failure is logged
                logger.exception("background upkeep failed")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(every(
            SESSION_SWEEP_INTERVAL_S, engine.sweep_sessions))]
        if integrity_interval > 0:
            tasks.append(asyncio.create_task(every(integrity_interval, engine.verify_integrity)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()

    return lifespan


def build_app(
    engine: EngineClient,
    api_keys: Iterable[str] = (),
    hints: bool | None = None,
    options: ServerOptions | None = None,
) -> FastAPI:
    """An OpenAI-compatible app serving `engine` (an `AsyncLLM`); no keys: no auth.

    `api_keys` add to `options.api_keys`. `hints`: act on Agent Hints; None follows the
    engine (`EngineConfig.hints`).
    """
    if hints is None:
        hints = engine.hints
    options = options or ServerOptions()
    if api_keys:
        options = replace(options, api_keys=options.api_keys + tuple(api_keys))
    app = FastAPI(
        title="hintkv",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        lifespan=_upkeep(engine, options.integrity_check_interval),
    )
    metrics = ServerMetrics(
        engine.stats, engine.tier_stats, lambda: engine.num_integrity_violations
    )
    gate = LoadGate(
        engine.max_num_seqs + options.max_queued_requests,
        options.tenant_rate_limit,
        options.tenant_max_concurrency,
    )
    app.state.hintkv = ServerState(
        engine=engine, options=options, metrics=metrics, gate=gate, hints=hints
    )
    install_error_handlers(app)
    for module in (routes_chat, routes_completions, routes_sessions, routes_info):
        app.include_router(module.router)
    app.add_middleware(CatchAll, on_error=metrics.internal_errors.inc)
    app.add_middleware(RequestCounter, metrics=metrics)  # outermost: counts CatchAll's 500s too
    return app
