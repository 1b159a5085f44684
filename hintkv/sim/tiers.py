"""Lower tiers in the simulator: the real `HostTier`, `TierStack` and `TierConnector` on a small
payload, with the `VirtualMover` for time; with `pool`, the cluster's shared pool below the host.

    kv.tiers = sim_tiers(kv, hints=True, host_blocks=4 * num_blocks, clock=clock, costs=costs)

Blocks carry a payload of 2 x block_size bytes (uint8, K and V, one layer, one head of width 1: 32
bytes at block 16, 128 at block 64) instead of the model's KV: the bookkeeping (what is stored,
evicted, loaded, offloaded, prefetched; in which order) is the real code's, and every transfer
takes the time of the profile's real block bytes. Byte figures
the tiers report are in payload bytes; `real_bytes` converts them. The connector's own cost
estimates (`TransferCosts`: a block's load time, read by SAM's prefetch lead, a kept prefix's
lapse, the same-step wait limit, whether a load beats a recompute) price a block at the real bytes
too (502e571; before it they took the payload's, and read a load as ~65,000x cheaper than the copies
the mover times: a Llama-3-8B block of 64 tokens is 8 MiB, not 128 bytes, until enough loads were
learned to pull the bandwidth estimate down to match); the host's and the pool's estimates start at
the profile's links, which these tiers report as the real ones do their own (`Tier.read_bps`, seeded
by the connector: one hook; tests/sim pin both).
"""

from __future__ import annotations

import torch

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.types import DEFAULT_OFFLOAD_MODE
from hintkv.cache.tier_connector import TierConnector
from hintkv.sim.clock import EventClock
from hintkv.sim.costs import CostModel
from hintkv.sim.mover import VirtualMover
from hintkv.sim.pool import SimPool
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack


def real_block_bytes(costs: CostModel, block_size: int) -> int:
    return costs.profile.kv_bytes_per_token * block_size


def sim_tiers(kv: KVCacheManager, hints: bool, host_blocks: int, clock: EventClock,
              costs: CostModel, pool: SimPool | None = None, offload_mode: str = DEFAULT_OFFLOAD_MODE) -> TierConnector:
    """`pool`: the cluster's shared pool, below the host tier (a `SimPoolTier` per instance);
    `offload_mode`: what an offload hint does (`EngineConfig.offload_mode`, as the server's)."""
    bs = kv.block_size
    num_blocks = kv.pool.num_blocks
    device = [torch.zeros((2, num_blocks, bs, 1, 1), dtype=torch.uint8)]
    io = DeviceBlockIO(device)
    mover = VirtualMover(clock, costs, real_block_bytes(costs, bs))
    links = costs.profile.links
    host = HostTier(io.layout, host_blocks * io.layout.nbytes, mover=mover)
    host.read_bps = links["host->device"].gbps * 1e9  # as the mover times its loads
    tiers = [host]
    if pool is not None:
        tiers.append(pool.tier(io.layout, clock, mover))
        if "pool->host" in links:
            tiers[-1].read_bps = links["pool->host"].gbps * 1e9
    stack = TierStack(tiers, mover=mover)
    conn = TierConnector(kv.pool, bs, stack, io, kv.ranking, hints, clock=clock, offload_mode=offload_mode)
    conn.costs.block_bytes = real_block_bytes(costs, bs)  # the profile's block, not the payload's
    return conn
