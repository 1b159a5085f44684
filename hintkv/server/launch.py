"""Run the server: build the engine from a config, serve it with uvicorn, shut both down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import uvicorn

from hintkv.server import event_loop
from hintkv.server.app import build_app
from hintkv.server.options import ServerOptions

if TYPE_CHECKING:
    from hintkv.config import EngineConfig
    from hintkv.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)


def serve(
    engine_cfg: EngineConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_keys: Iterable[str] = (),
    log_level: str = "info",
    options: ServerOptions | None = None,
) -> None:
    """Load the model, serve the OpenAI API on host:port until interrupted, on the event loop that
    `options.loop` names (`event_loop.py`)."""
    options = options or ServerOptions()
    with asyncio.Runner(loop_factory=event_loop.loop_factory(options.loop)) as runner:
        runner.run(_serve(engine_cfg, host, port, tuple(api_keys), log_level, options))


def start_engine(engine_cfg: EngineConfig) -> AsyncLLM:
    """Build the engine, then set the collector for serving (`engine.gc_tuning`: the start-up
    heap frozen, young collections rarer), so that its pauses fall in few steps. The model is
    loaded and warmed on a passing thread (`cpu_threads.on_passing_thread`): no OpenMP pool outlives
    it beside the engine thread's, and the tier threads run their copies without OpenMP
    (`openmp_env.serial_openmp_thread`), so libgomp spins as GOMP_SPINCOUNT says, not its throttled 100."""
    from hintkv.engine import cpu_threads
    from hintkv.engine.async_llm import AsyncLLM  # heavy: torch and the model
    from hintkv.engine.gc_tuning import tune_for_serving
    from hintkv.engine.llm_engine import LLMEngine

    engine = AsyncLLM(cpu_threads.on_passing_thread(lambda: LLMEngine(engine_cfg)))
    tune_for_serving()
    return engine


async def _serve(
    engine_cfg: EngineConfig,
    host: str,
    port: int,
    api_keys: tuple[str, ...],
    log_level: str,
    options: ServerOptions,
) -> None:
    engine = start_engine(engine_cfg)
    logger.info(
        "serving %s on http://%s:%d (max_model_len %d, KV pool %d tokens)",
        engine.model_name,
        host,
        port,
        engine.max_model_len,
        engine.num_kv_tokens,
    )
    try:
        config = uvicorn.Config(
            build_app(engine, api_keys, options=options),
            host=host,
            port=port,
            log_level=log_level,
            http=event_loop.http_parser(options.http),
            timeout_graceful_shutdown=5,
        )
        await uvicorn.Server(config).serve()
    finally:
        await engine.shutdown()
