"""Lower tiers in the simulator: the real `HostTier`, `TierStack` and `TierConnector` on a small
payload, with the `VirtualMover` for time; with `pool`, the cluster's shared pool below the host.

    kv.tiers = sim_tiers(kv, hints=True, host_blocks=4 * num_blocks, clock=clock, costs=costs)

Blocks carry a 32-byte payload (uint8, one layer, one head of width 1) instead of the model's KV:
the bookkeeping (what is stored, evicted, loaded, offloaded, prefetched; in which order) is the
real code's, and every transfer takes the time of the profile's real block bytes. Byte figures
the tiers report are in payload bytes; `real_bytes` converts them.
"""

from __future__ import annotations

import torch

from hintkv.cache.manager import KVCacheManager
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
              costs: CostModel, pool: SimPool | None = None, offload_mode: str = "lazy") -> TierConnector:
    """`pool`: the cluster's shared pool, below the host tier (a `SimPoolTier` per instance);
    `offload_mode`: what an offload hint does (`EngineConfig.offload_mode`, as the server's)."""
    bs = kv.block_size
    num_blocks = kv.pool.num_blocks
    device = [torch.zeros((2, num_blocks, bs, 1, 1), dtype=torch.uint8)]
    io = DeviceBlockIO(device)
    mover = VirtualMover(clock, costs, real_block_bytes(costs, bs))
    host = HostTier(io.layout, host_blocks * io.layout.nbytes, mover=mover)
    tiers = [host]
    if pool is not None:
        tiers.append(pool.tier(io.layout, clock, mover))
    stack = TierStack(tiers, mover=mover)
    return TierConnector(kv.pool, bs, stack, io, kv.ranking, hints, clock=clock, offload_mode=offload_mode)
