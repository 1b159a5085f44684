"""The latency probe of `hintkv bench overload`: a light client in a process of its own.

The load generator keeps hundreds of requests in flight on one event loop, so a latency it
measures includes the time its own loop took to notice the answer (on 2 shared cores, tens of
ms). The probe sends, every 50 ms, one management request (an evict hint on its own sessions)
and, every 200 ms, one generation request (refused while the server is full); it records the
management round trips and the refusals' round trips, each on a loop with nothing else to do.

    result = run_probe(base_url, seconds)   # starts the process, waits for its numbers
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time

import httpx

MANAGE_EVERY_S = 0.05
GENERATE_EVERY = 4  # one generation request per this many management requests
PROMPT = list(range(200, 224))


async def _probe(base: str, seconds: float) -> dict:
    out: dict = {"manage_ms": [], "refuse_ms": [], "admitted": 0, "lost": 0,
                 "refusals_without_retry_after": 0}

    async def generate(client: httpx.AsyncClient) -> None:
        t0 = time.perf_counter()
        try:
            r = await client.post("/v1/completions", json={
                "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        except httpx.HTTPError:
            out["lost"] += 1
            return
        if r.status_code in (429, 503):
            out["refuse_ms"].append((time.perf_counter() - t0) * 1000)
            out["refusals_without_retry_after"] += "retry-after" not in r.headers
        elif r.status_code == 200:
            out["admitted"] += 1
        else:
            out["lost"] += 1

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        await client.get("/health")  # connect before measuring
        tasks = []
        end, i = time.perf_counter() + seconds, 0
        while time.perf_counter() < end:
            if i % GENERATE_EVERY == 0:
                tasks.append(asyncio.create_task(generate(client)))
            sid = f"probe-{i % 16}"
            t0 = time.perf_counter()
            try:
                r = await client.post("/v1/completions", json={"prompt": "", "agent_hint": {
                    "session_id": sid, "parent_session_id": sid,
                    "context_management": {"manage_request": True,
                                           "edits": [{"type": "evict", "target": "session"}]}}})
                if r.status_code == 200:
                    out["manage_ms"].append((time.perf_counter() - t0) * 1000)
                else:
                    out["lost"] += 1
            except httpx.HTTPError:
                out["lost"] += 1
            i += 1
            await asyncio.sleep(MANAGE_EVERY_S)
        await asyncio.gather(*tasks)
    return out


def _main(base: str, seconds: float, queue) -> None:
    queue.put(asyncio.run(_probe(base, seconds)))


class Probe:
    """The probe process: `start()` before the load, `await result()` after it."""

    def __init__(self, base: str, seconds: float) -> None:
        ctx = multiprocessing.get_context("spawn")  # no copy of the load generator's state
        self._queue = ctx.Queue()
        self._proc = ctx.Process(target=_main, args=(base, seconds, self._queue), daemon=True)

    def start(self) -> Probe:
        self._proc.start()
        return self

    async def result(self, timeout_s: float = 300.0) -> dict:
        out = await asyncio.to_thread(self._queue.get, True, timeout_s)
        await asyncio.to_thread(self._proc.join, 10)
        return out
