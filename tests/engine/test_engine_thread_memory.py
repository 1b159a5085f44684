"""A prefill on the engine thread reuses freed memory (host_memory.keep_freed_memory's single arena): the
engine thread's own malloc arena unmapped its 64 MB heaps as they emptied, 116K minor faults per 2048-token
request through AsyncLLM before."""

from __future__ import annotations

import asyncio
import random
import resource

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.engine.types import GenerateRequest, SamplingParams


def test_a_2048_token_prefill_on_the_engine_thread_takes_no_fresh_pages():
    llm = AsyncLLM.from_config(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu",
                                            kv_cache_tokens=8192, max_model_len=4096, max_num_batched_tokens=2048))
    rng = random.Random(0)

    async def faults_per_request() -> list[int]:
        out = []
        for i in range(3):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            prompt = [rng.randrange(100, 49000) for _ in range(2048)]  # fresh: nothing cached
            async for _ in llm.generate(GenerateRequest(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=1))):
                pass
            out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return out

    async def run() -> list[int]:
        try:
            return await faults_per_request()
        finally:
            await llm.shutdown()

    faults = asyncio.run(run())
    assert faults[-1] < 1000, faults  # the first request grows the heap once
