"""A same-step load wait does not hold up the server: while a step waits for a host load (held up
by real mover jobs that wait on an event), /metrics (tier stats under the engine's state lock)
and a session read answer; then the load is let through and lands in the step that started it."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from pathlib import Path

import httpx
from server_testing import API_KEY, BLOCK_SIZE

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.engine.sequence import SeqStatus
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from load_gate import MoverGate, slow_but_worth_loading  # noqa: E402

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def _prompt(seed: int, blocks: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(blocks * BLOCK_SIZE)]


def _complete(base: str, tokens: list[int]) -> httpx.Response:
    body = {"model": "m", "prompt": tokens, "max_tokens": 1, "temperature": 0, "ignore_eos": True}
    return httpx.post(base + "/v1/completions", json=body, headers=HEADERS, timeout=300)


def _loading(engine) -> bool:
    return any(s.status is SeqStatus.LOADING for s in list(engine.scheduler.requests.values()))


def test_metrics_and_session_reads_answer_during_a_same_step_load_wait():
    engine = AsyncLLM.from_config(EngineConfig(
        model="dummy:tiny", dtype="float32", device="cpu", block_size=BLOCK_SIZE, served_model_name="m",
        kv_cache_tokens=8 * BLOCK_SIZE, host_cache_memory="4MiB", load_timing="same-step", hints=False))
    a = _prompt(1, 4)
    try:
        with BackgroundServer(build_app(engine, [API_KEY])) as srv:
            base = srv.base_url
            assert _complete(base, a).status_code == 200
            for seed in (2, 3):  # each fills the 8-block pool: a's blocks go to the host tier
                assert _complete(base, _prompt(seed, 7)).status_code == 200
            tiers = engine.engine.tiers
            slow_but_worth_loading(tiers)
            gate = MoverGate(tiers.stack.mover)
            again: list[httpx.Response] = []
            client = threading.Thread(target=lambda: again.append(_complete(base, a)))
            client.start()
            try:
                ev = threading.Event()
                for _ in range(6000):
                    if _loading(engine.engine):
                        break
                    ev.wait(0.01)
                assert _loading(engine.engine), "the request never started its host load"
                # deadlines, not timing checks: under the lock these wait the whole limit (minutes)
                metrics = httpx.get(base + "/metrics", headers=HEADERS, timeout=60)
                missing = httpx.get(base + "/v1/sessions/nobody", headers=HEADERS, timeout=60)
                assert _loading(engine.engine)  # answered while the load was still held up
            finally:
                gate.release()
                client.join(timeout=120)
            assert metrics.status_code == 200 and "hintkv_prompt_tokens_computed" in metrics.text
            assert missing.status_code == 404
            assert again and again[0].status_code == 200
            stats = engine.tier_stats()
            assert stats["hit_tokens"]["host"] >= 3 * BLOCK_SIZE and stats["num_load_timeouts"] == 0
    finally:
        asyncio.run(engine.shutdown())
