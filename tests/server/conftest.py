"""A real hintkv server for the server tests: dummy:tiny weights, the real SmolLM2 tokenizer,
a small KV pool, uvicorn on a free loopback port in a background thread (once per session).

The pool (512 tokens) is smaller than max_model_len (1024) so that both limits can be hit.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest
import uvicorn
from server_testing import (
    API_KEY,
    BLOCK_SIZE,
    KV_CACHE_TOKENS,
    MAX_MODEL_LEN,
    LiveServer,
    wait_until,
)

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.server import build_app


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
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(build_app(engine, [API_KEY]), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started, timeout=30), "uvicorn did not start"
    yield LiveServer(base_url=f"http://127.0.0.1:{port}", engine=engine, port=port)
    server.should_exit = True
    thread.join(timeout=10)
    asyncio.run(engine.shutdown())
