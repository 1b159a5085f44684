"""rev26 A16: an instance's 429 / 503 carries Retry-After (server/load.py: "refuse early and say when to retry");
the router relays the status and body but builds its reply with only content-type and x-hintkv-backend, so the
client behind the router never gets Retry-After (the openai SDK's backoff reads it)."""

from __future__ import annotations

import asyncio

import httpx

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.router import build_router_app
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer
from hintkv.server.options import ServerOptions


def test_retry_after_reaches_the_client_through_the_router():
    engine = AsyncLLM.from_config(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=16,
                                               kv_cache_tokens=256, max_model_len=256, max_num_seqs=2))
    try:
        app = build_app(engine, options=ServerOptions(tenant_rate_limit=0.01))  # a burst of 1
        with BackgroundServer(app) as inst, BackgroundServer(build_router_app([inst.base_url])) as router:
            body = {"prompt": "hi", "max_tokens": 1}
            direct = [httpx.post(inst.base_url + "/v1/completions", json=body, timeout=60) for _ in range(2)]
            assert direct[1].status_code == 429 and "retry-after" in direct[1].headers
            routed = httpx.post(router.base_url + "/v1/completions", json=body, timeout=60)
            assert routed.status_code == 429
            assert "retry-after" in routed.headers, dict(routed.headers)
    finally:
        asyncio.run(engine.shutdown())
