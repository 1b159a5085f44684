"""AsyncLLM: the engine on its own thread, driven from asyncio; implements `EngineClient`.

Requests and aborts are queued to the engine thread and applied between steps, so the engine's
state is only ever touched by one thread (management calls take the engine's state lock from a
worker thread instead, so they apply within milliseconds even during a long forward). Outputs
come back through one asyncio queue per request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from hintkv.config import EngineConfig
from hintkv.engine import cpu_threads
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import (
    CacheEdit,
    EditOutcome,
    EngineStats,
    GenerateRequest,
    RequestMetrics,
    RequestOutput,
    SessionDescription,
    SessionRef,
)

log = logging.getLogger(__name__)


class AsyncLLM:
    """An `EngineClient` (see `engine/client.py`) around one `LLMEngine`."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.model_name = engine.model_name
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.num_kv_tokens = engine.num_kv_tokens
        self.hints = engine.cfg.hints
        self.max_num_seqs = engine.cfg.max_num_seqs
        # Management calls take the state lock in their own threads: a flood of them never
        # queues behind other work on asyncio's default threads, nor blocks the event loop.
        self._manage_pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="hintkv-manage")
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopping = False
        self._bind_cpus = cpu_threads.engine_cpus(engine.cfg.cpu_omp_threads_bind, engine.device.type)
        self.bound_tids: list[int] = []  # the engine thread's OpenMP threads, once bound (--cpu-omp-threads-bind)
        self.num_integrity_violations = 0  # failed check_integrity() calls while serving
        self._thread = threading.Thread(target=self._loop, name="hintkv-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The engine thread still runs: once it is gone every request would wait forever (/health says so)."""
        return self._thread.is_alive()

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> AsyncLLM:
        return cls(LLMEngine(cfg))

    # ---- engine thread -------------------------------------------------------------------
    def _loop(self) -> None:
        self.bound_tids = cpu_threads.bind_engine_thread(self._bind_cpus)
        while not self._stopping:
            while True:
                try:
                    self._inbox.get_nowait()()
                except queue.Empty:
                    break
            if not self.engine.has_work():
                self._wake.wait(0.5)
                self._wake.clear()
                self.engine.idle_tick()  # the pool's keep-alive of live sessions, step or no step
                continue
            try:
                outputs = self.engine.step()
            except Exception:  # a bug in a step must not leave clients hanging forever
                log.exception("engine step failed; aborting running requests")
                outputs = self._fail_all("internal engine error")
            self._deliver(outputs)
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
        for rid in self.engine.request_ids():
            self.engine.abort_request(rid)
            outs.append(RequestOutput(rid, finished=True, finish_reason="abort", error=message))
        return outs

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs to their requests' queues: one wake-up of each event loop a step,
        not one a request (8 self-pipe writes at batch 8, and as many callbacks on the loop: #11)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
        for out in outputs:
            entry = self._queues.get(out.request_id)
            if entry is not None:
                loop, q = entry
                by_loop.setdefault(loop, []).append((q, out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # "Event loop is closed": left to propagate, it ended the engine thread
                self._drop_loop(loop)

    def _drop_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Engine thread: `loop` was closed while requests were still registered on it (a client thread, or a
        BackgroundServer, stopped with a stream in flight). Nobody reads their outputs again, so each is aborted
        (its blocks freed) and forgotten; the other loops' requests go on."""
        dead = [rid for rid, (q_loop, _) in self._queues.copy().items() if q_loop is loop]
        for rid in dead:
            self._queues.pop(rid, None)
            self.engine.abort_request(rid)
        log.warning("event loop closed with %d request(s) in flight, aborted: %s", len(dead), ", ".join(dead))

    def _add(self, req: GenerateRequest) -> float:
        """Add `req` on the engine thread; when it was in (perf_counter: the inbox wait's end, the
        running step and the state lock, which hint edits and /metrics also take, both in it). Not
        when its event loop closed while it waited in the inbox: nobody would read it."""
        entry = self._queues.get(req.request_id)
        if entry is not None and entry[0].is_closed():
            self._drop_loop(entry[0])
        else:
            self.engine.add_request(req)
        return time.perf_counter()

    def call(self, fn: Callable[[LLMEngine], Any]) -> concurrent.futures.Future:
        """Run `fn(engine)` on the engine thread between steps; returns a Future of its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def job() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn(self.engine))
            except Exception as e:  # noqa: BLE001 - not swallowed: the caller's future raises it
                fut.set_exception(e)
            except BaseException as e:  # SystemExit, KeyboardInterrupt: the caller hears of it
                fut.set_exception(e)  # too, and the engine thread stops
                raise
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
            handed = time.perf_counter()
            taken = await self.run(lambda e: self._add(req))
            while True:
                out = await q.get()
                finished = out.finished
                if finished and out.metrics is not None:
                    out.metrics.inbox_s = taken - handed
                yield out
                if finished:
                    return
        finally:
            self._queues.pop(rid, None)
            if not finished:
                self.call(lambda e: e.abort_request(rid))

    def abort(self, request_id: str) -> Awaitable[RequestMetrics | None]:
        return asyncio.wrap_future(self.call(lambda e: e.abort_request(request_id)))  # queued now

    async def manage(self, ref: SessionRef, edits: list[CacheEdit]) -> list[EditOutcome]:
        # a worker thread, not the engine thread: the state lock is free during forward passes
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._manage_pool, self.engine.manage, ref, edits)

    async def describe_session(self, tenant: str, session_id: str) -> SessionDescription | None:
        return await asyncio.to_thread(self.engine.describe_session, tenant, session_id)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def tier_stats(self) -> dict[str, Any]:
        return self.engine.tier_stats()

    async def check_integrity(self) -> None:
        await self.run(lambda e: e.check_integrity())

    async def verify_integrity(self) -> bool:
        """Like `check_integrity`, but a violation is counted and logged, not raised."""
        return await self.run(lambda e: self._check_integrity())

    async def sweep_sessions(self) -> int:
        loop = asyncio.get_running_loop()  # takes the state lock briefly, like manage
        return await loop.run_in_executor(self._manage_pool, self.engine.sweep_sessions)

    async def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 5)
        self._manage_pool.shutdown(wait=False)
        self.engine.close()


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    """On the event loop: each output into its request's queue, in the step's order."""
    for q, out in items:
        q.put_nowait(out)
