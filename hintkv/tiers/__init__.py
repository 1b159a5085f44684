"""hintkv.tiers: the KV storage below the device pool (host buffer, disk files) and the engine
that moves blocks between them.

- `layout.BlockLayout`: the payload of one block, all layers (identical bytes on every tier).
- `device.DeviceBlockIO`: gather / scatter blocks between the per-layer device cache and payloads.
- `base.Tier`: the one contract (contains, async batched put, async get, remove, usage, integrity).
- `host.HostTier`, `disk.DiskTier`: the tiers; `stack.TierStack`: their ordered hierarchy.
- `mover.Mover`: thread pool (+ CUDA copy stream) that runs the copies and counts them.
"""

from hintkv.tiers.base import Tier, TierStats, TierUsage
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.disk import DiskTier
from hintkv.tiers.host import HostTier
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.mover import Mover, MoverStats
from hintkv.tiers.stack import StackStats, TierStack

__all__ = ["BlockLayout", "DeviceBlockIO", "DiskTier", "HostTier", "Mover", "MoverStats",
           "StackStats", "Tier", "TierStack", "TierStats", "TierUsage"]
