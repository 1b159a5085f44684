"""A real hintkv server for the server tests: dummy:tiny weights, the real SmolLM2 tokenizer,
a small KV pool, uvicorn on a free loopback port in a background thread (once per session).

The pool (512 tokens) is smaller than max_model_len (1024) so that both limits can be hit.
Two API keys are accepted, so tenant isolation can be tested across keys. A second app over
the same engine (`ignoring_server`) runs with Agent Hints ignored, as `--ignore-hints` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from server_testing import (
    API_KEY,
    BLOCK_SIZE,
    KV_CACHE_TOKENS,
    MAX_MODEL_LEN,
    OTHER_API_KEY,
    LiveServer,
)

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    engine = AsyncLLM.from_config(
        EngineConfig(
            model="dummy:tiny",
            dtype="float32",
            device="cpu",
            block_size=BLOCK_SIZE,
            kv_cache_tokens=KV_CACHE_TOKENS,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=8,
        )
    )
    try:
        with BackgroundServer(build_app(engine, [API_KEY, OTHER_API_KEY])) as srv:
            yield LiveServer(base_url=srv.base_url, engine=engine, port=srv.port)
    finally:
        asyncio.run(engine.shutdown())


@pytest.fixture(scope="module")
def ignoring_server(live_server: LiveServer) -> Iterator[LiveServer]:
    """The same engine behind an app that validates hints but never acts on them."""
    with BackgroundServer(build_app(live_server.engine, [API_KEY], hints=False)) as srv:
        yield LiveServer(base_url=srv.base_url, engine=live_server.engine, port=srv.port)
