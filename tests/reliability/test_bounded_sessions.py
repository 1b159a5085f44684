"""Bounded state while serving: the server forgets idle sessions on its own (the upkeep task
sweeps every second), and a forgotten session comes back fresh when its agent returns."""

from __future__ import annotations

import asyncio

import httpx
from faults import API_KEY, HEADERS, assert_nothing_leaked, greedy, prompts, wait_until

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer


def test_idle_sessions_are_forgotten_while_serving():
    engine = AsyncLLM.from_config(EngineConfig(
        model="dummy:tiny", dtype="float32", device="cpu", kv_cache_tokens=1024,
        max_model_len=256, max_num_seqs=4, session_idle_expiry=1.0, max_sessions_per_tenant=3))
    try:
        with BackgroundServer(build_app(engine, [API_KEY])) as srv, \
                httpx.Client(base_url=srv.base_url, timeout=60) as c:
            p = prompts(5)
            first = [greedy(c, p[i], session=f"agent-{i}") for i in range(5)]

            def remembered() -> int:
                return sum(c.get(f"/v1/sessions/agent-{i}", headers=HEADERS).status_code == 200
                           for i in range(5))

            assert wait_until(lambda: remembered() == 0, timeout=30)
            assert engine.engine.janitor.num_forgotten >= 5
            assert greedy(c, p[0], session="agent-0") == first[0]  # back, fresh
            info = c.get("/v1/sessions/agent-0", headers=HEADERS).json()
            assert info is not None
            assert_nothing_leaked(c, engine)
    finally:
        asyncio.run(engine.shutdown())
