"""An idle instance keeps its live sessions' pool blocks alive (review rev_rev28_a A4).

`SPM.tick` ran only inside a step's `schedule`; `AsyncLLM` takes no step while it has no work, so while an agent ran
a tool call its instance sent no keep-alive, the 5 s lease of the blocks its session held there lapsed, and another
instance's release (faf8696's capacity hand-back, an ended session's) removed them. Now the idle loop ticks too."""

from __future__ import annotations

import asyncio
import time

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.engine.types import GenerateRequest, SamplingParams
from tests.engine.tier_engine_helpers import prompt, session


def test_an_idle_engine_keeps_its_live_sessions_pool_blocks_alive(tmp_path):
    async def run() -> tuple[int, int, int]:
        llm = AsyncLLM.from_config(EngineConfig(
            model="dummy:tiny", dtype="float32", device="cpu", block_size=16, kv_cache_tokens=256,
            max_num_batched_tokens=256, pool="embedded", pool_size="4MiB", pool_dir=str(tmp_path),
            pool_write_through=True))
        try:
            req = GenerateRequest("r1", prompt(1, 64), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                                  session=session("s"))
            async for _ in llm.generate(req):
                pass
            spm = llm.engine.scheduler.kv.tiers.spm
            held = len(spm.held())
            ticks_at_end = spm.stats()["keepalive_ticks"]
            deadline = time.monotonic() + 60  # a tick is due each second; generous for a loaded box
            while spm.stats()["keepalive_ticks"] == ticks_at_end and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert not llm.engine.has_work()  # no step ran: the ticks came from the idle loop
            return held, ticks_at_end, spm.stats()["keepalive_ticks"]
        finally:
            await llm.shutdown()

    held, before, after = asyncio.run(run())
    assert held > 0  # the live session holds blocks the pool knows
    assert after > before, "no keep-alive while the engine idled"
