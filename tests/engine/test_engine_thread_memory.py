"""A prefill on the engine thread reuses freed memory (host_memory.keep_freed_memory's single arena): the
engine thread's own malloc arena unmapped its 64 MB heaps as they emptied, 116K minor faults per 2048-token
request through AsyncLLM before. Run in a fresh process, as `hintkv serve` is: glibc keeps an arena that a
thread took before the cap (or that an exited thread left) in use, and this test process ran many threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # this checkout's hintkv, not an installed one

PROBE = """
import asyncio, json, random, resource
from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.engine.types import GenerateRequest, SamplingParams

llm = AsyncLLM.from_config(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", kv_cache_tokens=8192,
                                        max_model_len=4096, max_num_batched_tokens=2048))
rng = random.Random(0)

async def run():
    out = []
    try:
        for i in range(3):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            prompt = [rng.randrange(100, 49000) for _ in range(2048)]  # fresh: nothing cached
            async for _ in llm.generate(GenerateRequest(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=1))):
                pass
            out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    finally:
        await llm.shutdown()
    return out

print(json.dumps(asyncio.run(run())))
"""


def test_a_2048_token_prefill_on_the_engine_thread_takes_no_fresh_pages():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    faults = json.loads(done.stdout.strip().splitlines()[-1])
    assert faults[-1] < 1000, faults  # the first request grows the heap once
