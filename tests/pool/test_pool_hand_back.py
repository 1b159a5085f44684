"""An ended session's pooled blocks go back to a real mooncake_master: its own counters, not only our index.

rev28 left it unchecked. Checked here, it did not hold when the ended session was the instance's last: the evict's
release met the lease of the keep-alive a moment before (-706, as designed: a leased block may be another instance's),
and the retry rode only on the next keep-alive pass, which an instance with no live session never sends. Our index
said 0 blocks; the master still held the 4 keys (512 KB) 10 s later, with a 5 s lease. Now an idle SPM tick retries
them until the lease lapses."""

from __future__ import annotations

import asyncio
import time

from hintkv.cache.types import CacheEdit
from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.tiers.pool_worker import RELEASE_RETRY_S
from tests.engine.tier_engine_helpers import BLOCK, prompt, session

HANG_S = 2 * RELEASE_RETRY_S  # a bound on waiting, not a timing: the lease is 5 s, a tick is due each second


def test_an_ended_sessions_blocks_leave_the_master_when_no_session_is_left(fresh_master):
    def master() -> tuple[int, int]:
        m = fresh_master.metrics()
        return int(m.get("master_key_count", 0)), int(m.get("master_allocated_bytes", 0))

    async def run() -> None:
        llm = AsyncLLM.from_config(EngineConfig(
            model="dummy:tiny", dtype="float32", device="cpu", block_size=BLOCK, kv_cache_tokens=256,
            max_num_batched_tokens=256, pool="mooncake", pool_size="16MiB", pool_master=fresh_master.rpc_address,
            pool_metadata=fresh_master.metadata_url, pool_write_through=True))
        try:
            req = GenerateRequest("r1", prompt(1, 4 * BLOCK), SamplingParams(temperature=0, max_tokens=4,
                                                                             ignore_eos=True), session=session("s1"))
            async for _ in llm.generate(req):
                pass
            pool = llm.engine.tiers.pool_tier
            await asyncio.to_thread(pool.flush)
            stored = pool.usage().num_blocks
            assert stored >= 4 and master()[0] == stored, (stored, master())
            spm = llm.engine.tiers.spm
            deadline = time.monotonic() + HANG_S
            while spm.stats()["keepalive_ticks"] == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # the idle loop's keep-alive: the master leases the keys
            assert spm.stats()["keepalive_ticks"] > 0
            await llm.manage(session("s1"), [CacheEdit("evict")])
            await asyncio.to_thread(pool.flush)
            assert pool.usage().num_blocks == 0  # our index let them go at once
            deadline = time.monotonic() + HANG_S
            while master() != (0, 0) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            stats = llm.tier_stats()["pool"]
            assert master() == (0, 0), (f"the master still holds {master()} (keys, bytes); released "
                                        f"{stats['released']}, held back by a lease {stats['release_leased']}")
            assert stats["released"] == stored
        finally:
            await llm.shutdown()

    asyncio.run(run())
