"""rev28 (not verified then): `AsyncLLM._deliver` hands a step's outputs to each request's event loop with
`call_soon_threadsafe`, outside the step's try. A request whose event loop was closed while it was still registered
(a client thread's loop, or a BackgroundServer's, stopped with a stream in flight) made that call raise RuntimeError
("Event loop is closed"), which ended the engine thread: every other request then waited forever. Verified on a real
AsyncLLM (this test, before the fix: the thread died and the other request timed out). A dead loop now drops only
its own requests (aborted, their blocks freed, logged); the engine keeps serving the others."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.server.event_loop import loop_factory

CFG = dict(model="dummy:tiny", dtype="float32", device="cpu", block_size=16, kv_cache_tokens=512,
           max_model_len=256, max_num_seqs=4)
HANG_S = 60  # a bound on a hang, not a timing: a healthy engine serves 8 tokens of dummy:tiny in well under 1 s


def _req(rid: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(rid, list(range(100, 140)), SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                       ignore_eos=True))


async def _first_output(gen) -> None:
    await gen.__anext__()  # the request is registered and running on the engine


async def _collect(engine: AsyncLLM, req: GenerateRequest) -> list:
    return [out async for out in engine.generate(req)]


def _served(engine: AsyncLLM) -> None:
    """Another request on a live loop is served to its end, and nothing else is left in the engine."""
    outs = asyncio.run(asyncio.wait_for(_collect(engine, _req("other", 8)), timeout=HANG_S))
    assert engine.alive, "the engine thread ended on a closed event loop"
    assert outs[-1].finished and outs[-1].finish_reason == "length" and outs[-1].error is None
    assert sum(len(o.new_token_ids) for o in outs) == 8
    ids = asyncio.run(asyncio.wait_for(engine.run(lambda e: e.request_ids()), timeout=HANG_S))
    assert ids == [], f"the dead loop's request was not aborted: {ids}"
    assert "orphan" not in engine._queues
    assert engine.stats().kv_blocks_in_use == 0, "the aborted request's blocks were not freed"
    asyncio.run(engine.check_integrity())


@pytest.fixture
def engine():
    engine = AsyncLLM.from_config(EngineConfig(**CFG))
    yield engine
    asyncio.run(engine.shutdown())


@pytest.mark.parametrize("kind", ["asyncio", "auto"])  # auto: uvloop where installed, the server's default
def test_a_closed_event_loop_drops_only_its_own_requests(engine, kind, caplog):
    dead = loop_factory(kind)()
    orphan = engine.generate(_req("orphan", 200))  # held: never finalized, so it stays registered
    dead.run_until_complete(_first_output(orphan))
    dead.close()  # closed with the stream in flight, as a stopped client thread leaves it
    with caplog.at_level(logging.WARNING, logger="hintkv.engine.async_llm"):
        _served(engine)
    assert any("orphan" in r.getMessage() for r in caplog.records), "the dropped request was not logged"
    asyncio.run(orphan.aclose())  # its `finally` runs on this loop, not the dead one: nothing left to abort


def test_a_request_whose_loop_closed_in_the_inbox_is_never_added(engine):
    """A loop can register a request and close during a step, after the inbox was read: the request's add then
    runs once that loop is gone. It is dropped there, never added (else it would run to max_tokens, read by nobody,
    once a delivery to that loop had already dropped its entry)."""
    gate = threading.Event()
    engine.call(lambda e: gate.wait(HANG_S))  # holds the engine thread: the add below waits in the inbox
    dead = asyncio.new_event_loop()
    task = dead.create_task(_first_output(engine.generate(_req("orphan", 200))))
    while "orphan" not in engine._queues:
        dead.run_until_complete(asyncio.sleep(0))
    dead.close()
    gate.set()
    _served(engine)
    assert engine.engine.scheduler.num_prompt_tokens == 40, "the closed loop's request was added"
    task.get_coro().close()  # the orphan's `finally`, here rather than in a dead loop's finalizer
