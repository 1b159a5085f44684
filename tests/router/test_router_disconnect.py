"""A client that leaves through the router aborts the generation on the instance, streamed or not
(review rev26 A1: a non-streamed request ran to its end, the router waiting on the instance's reply
without watching its own client). Raw sockets close the connection once the instance generates."""

from __future__ import annotations

import asyncio
import json
import re
import socket

import httpx
import pytest

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.router import build_router_app
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer
from tests.server.server_testing import wait_until

MAX_TOKENS = 900


def _generated(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return float(re.search(r"^hintkv_generation_tokens_total (\S+)$", text, re.M).group(1))


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_a_client_gone_through_the_router_aborts_the_generation_on_the_instance(stream):
    engine = AsyncLLM.from_config(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu",
                                               block_size=16, kv_cache_tokens=2048, max_model_len=1024,
                                               max_num_seqs=4))
    try:
        with BackgroundServer(build_app(engine, [])) as inst, \
                BackgroundServer(build_router_app([inst.base_url], health_interval_s=0.2)) as router:
            model = httpx.get(router.base_url + "/v1/models", timeout=30).json()["data"][0]["id"]
            before = _generated(inst.base_url)
            body = json.dumps({"model": model, "prompt": "Go on forever:", "max_tokens": MAX_TOKENS,
                               "temperature": 0, "ignore_eos": True, "stream": stream}).encode()
            head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            sock = socket.create_connection(("127.0.0.1", router.port), timeout=60)
            try:
                sock.sendall(head + body)
                assert wait_until(lambda: _generated(inst.base_url) > before)
            finally:
                sock.close()
            assert wait_until(lambda: engine.stats().num_running == 0 and engine.stats().num_waiting == 0)
            assert engine.stats().kv_blocks_in_use == 0
            assert _generated(inst.base_url) - before < MAX_TOKENS, "the instance generated every token"
            assert wait_until(lambda: router.app.state.router.backends.backends[inst.base_url].inflight == 0)
    finally:
        asyncio.run(engine.shutdown())
