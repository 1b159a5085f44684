"""Helpers of the fault matrix (tests/reliability): prompts, greedy requests, leak checks."""

from __future__ import annotations

import asyncio
import random
import time
from contextlib import contextmanager

import httpx

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer

API_KEY = "reliability-key"
HEADERS = {"authorization": f"Bearer {API_KEY}"}
MAX_TOKENS = 6


@contextmanager
def serving(**options):
    """A live server on dummy:tiny (integrity checked after every step) and a client of it;
    `options`: EngineConfig fields over the small defaults (tiers, KV size, ...)."""
    engine = AsyncLLM.from_config(EngineConfig(**{
        "model": "dummy:tiny", "dtype": "float32", "device": "cpu", "kv_cache_tokens": 512,
        "max_model_len": 256, "max_num_seqs": 4, "debug_integrity": True, **options}))
    try:
        with BackgroundServer(build_app(engine, [API_KEY])) as srv, \
                httpx.Client(base_url=srv.base_url, timeout=120) as client:
            yield engine, client
    finally:
        asyncio.run(engine.shutdown())


def prompts(n: int, length: int = 40, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(n)]


def body(prompt: list[int], session: str | None = None, stream: bool = False) -> dict:
    out = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
           "return_token_ids": True, "stream": stream}
    if session is not None:
        out["agent_hint"] = {"session_id": session, "parent_session_id": session}
    return out


def greedy(client: httpx.Client, prompt: list[int], session: str | None = None) -> list[int]:
    r = client.post("/v1/completions", json=body(prompt, session), headers=HEADERS)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def manage(client: httpx.Client, session: str, edit: str) -> httpx.Response:
    return client.post("/v1/completions", headers=HEADERS, json={"prompt": "", "agent_hint": {
        "session_id": session, "parent_session_id": session,
        "context_management": {"manage_request": True,
                               "edits": [{"type": edit, "target": "session"}]}}})


def metric(client: httpx.Client, name: str) -> float:
    text = client.get("/metrics", headers=HEADERS).text
    return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[-1])


def assert_nothing_leaked(client: httpx.Client, engine) -> None:
    """No KV block in use, integrity holds, no internal error was counted."""
    assert wait_until(lambda: engine.stats().kv_blocks_in_use == 0), engine.stats()
    asyncio.run(engine.check_integrity())
    assert metric(client, "hintkv_internal_errors_total") == 0
    assert metric(client, "hintkv_integrity_violations_total") == 0


def wait_until(condition, timeout: float = 60.0, interval: float = 0.05) -> bool:
    """Poll until `condition` holds (a deadline, never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()
