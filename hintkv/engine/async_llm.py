"""AsyncLLM: the engine on its own thread, driven from asyncio (the server's side of the contract).

Requests, aborts and management calls are queued to the engine thread and applied between steps,
so the engine's state is only ever touched by one thread. Outputs come back through one asyncio
queue per request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from hintkv.config import EngineConfig
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, RequestOutput

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_blocks_total: int
    kv_blocks_in_use: int
    kv_blocks_cached: int
    prefix_query_tokens: int
    prefix_hit_tokens: int


class AsyncLLM:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.model_name = engine.model_name
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.num_kv_tokens = engine.num_kv_tokens
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopping = False
        self.num_integrity_violations = 0  # failed check_integrity() calls while serving
        self._thread = threading.Thread(target=self._loop, name="hintkv-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> "AsyncLLM":
        return cls(LLMEngine(cfg))

    # ---- engine thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping:
            while True:
                try:
                    self._inbox.get_nowait()()
                except queue.Empty:
                    break
            if not self.engine.has_work():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception:  # a bug in a step must not leave clients hanging forever
                log.exception("engine step failed; aborting running requests")
                outputs = self._fail_all("internal engine error")
            for out in outputs:
                self._deliver(out)
            if self.engine.cfg.debug_integrity:
                self._check_integrity()

    def _check_integrity(self) -> bool:
        """Run the engine's integrity checks on the engine thread; count and log a violation."""
        try:
            self.engine.check_integrity()
            return True
        except AssertionError:
            self.num_integrity_violations += 1
            log.exception("cache integrity violated")
            return False

    def _fail_all(self, message: str) -> list[RequestOutput]:
        outs = []
        for rid in list(self.engine._seqs):
            self.engine.abort_request(rid)
            outs.append(RequestOutput(rid, finished=True, finish_reason="abort", error=message))
        return outs

    def _deliver(self, out: RequestOutput) -> None:
        entry = self._queues.get(out.request_id)
        if entry is not None:
            loop, q = entry
            loop.call_soon_threadsafe(q.put_nowait, out)

    def call(self, fn: Callable[[LLMEngine], Any]) -> concurrent.futures.Future:
        """Run `fn(engine)` on the engine thread between steps; returns a Future of its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def job() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn(self.engine))
            except BaseException as e:  # handed back to the caller
                fut.set_exception(e)
        self._inbox.put(job)
        self._wake.set()
        return fut

    async def run(self, fn: Callable[[LLMEngine], Any]) -> Any:
        return await asyncio.wrap_future(self.call(fn))

    # ---- the server's API ----------------------------------------------------------------
    async def generate(self, req: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; closing the iterator early aborts it and frees its KV."""
        q: asyncio.Queue[RequestOutput] = asyncio.Queue()
        rid = req.request_id
        self._queues[rid] = (asyncio.get_running_loop(), q)
        finished = False
        try:
            await self.run(lambda e: e.add_request(req))
            while True:
                out = await q.get()
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            self._queues.pop(rid, None)
            if not finished:
                self.call(lambda e: e.abort_request(rid))

    async def abort(self, request_id: str) -> None:
        await self.run(lambda e: e.abort_request(request_id))

    def stats(self) -> EngineStats:
        e = self.engine
        pool = e.kv.pool
        return EngineStats(len(e.scheduler.running), len(e.scheduler.waiting), e.scheduler.num_preemptions,
                           pool.num_blocks, pool.num_in_use, pool.num_cached_free,
                           e.kv.prefix_query_tokens, e.kv.prefix_hit_tokens)

    async def check_integrity(self) -> None:
        await self.run(lambda e: e.check_integrity())

    async def verify_integrity(self) -> bool:
        """Like `check_integrity`, but a violation is counted and logged, not raised."""
        return await self.run(lambda e: self._check_integrity())

    async def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 5)
        self.engine.close()
