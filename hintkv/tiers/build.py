"""Build the tier stack from the server's flags: `--host-cache-memory`, `--disk-cache-dir`,
`--disk-cache-size` (sizes as "4GiB", "512MB" or plain bytes).

    stack = build_tier_stack(layout, host_cache_memory="4GiB", disk_cache_dir="/var/kv",
                             disk_cache_size="20GiB", cuda=True)

One movement engine serves both tiers (one copy stream on CUDA, pinned host buffer); no flags,
no stack (None): offload is then simply off.
"""

from __future__ import annotations

import os

import torch

from hintkv.config import check_disk_config, parse_bytes
from hintkv.pool.backend import make_backend
from hintkv.pool.mooncake import MIN_SEGMENT_BYTES
from hintkv.tiers.base import Tier
from hintkv.tiers.disk import DiskTier
from hintkv.tiers.disk_format import HEADER_SIZE
from hintkv.tiers.host import HostTier
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.mover import Mover
from hintkv.tiers.pool import PoolTier
from hintkv.tiers.stack import TierStack


def build_tier_stack(layout: BlockLayout, host_cache_memory: str | int | None = None,
                     disk_cache_dir: str | None = None, disk_cache_size: str | int | None = None,
                     reuse_disk: bool = False, cuda: bool = False,
                     num_workers: int = 2, pool: Tier | None = None) -> TierStack | None:
    """The host and/or disk tiers the flags ask for, ordered host then disk; None for neither.
    Raises ValueError for unusable flags (a disk directory without a size, sizes too small for
    one block); a directory that cannot be written is not an error (see `DiskTier`)."""
    check_disk_config(disk_cache_dir, disk_cache_size)
    if host_cache_memory is None and disk_cache_dir is None and pool is None:
        return None
    host_bytes = None if host_cache_memory is None else parse_bytes(host_cache_memory)
    disk_bytes = None if disk_cache_size is None else parse_bytes(disk_cache_size)
    for name, size, block in (("host", host_bytes, layout.nbytes),
                              ("disk", disk_bytes, HEADER_SIZE + layout.nbytes)):
        if size is not None and size < block:  # checked before the disk tier wipes anything
            raise ValueError(f"the {name} tier's size ({size} bytes) holds no {block}-byte block")
    use_cuda = cuda and torch.cuda.is_available()
    mover = Mover(num_workers=num_workers, use_cuda_stream=use_cuda)
    tiers: list[Tier] = []
    if host_bytes is not None:
        tiers.append(HostTier(layout, host_bytes, pin=use_cuda, mover=mover))
    if disk_cache_dir is not None and disk_bytes is not None:
        tiers.append(DiskTier(layout, disk_cache_dir, disk_bytes, reuse=reuse_disk, mover=mover))
    if pool is not None:
        tiers.append(pool)
    return TierStack(tiers, mover=mover, owns_mover=True)


def build_pool_tier(layout: BlockLayout, backend: str, size: str | int, policy: str = "spm",
                    directory: str | None = None, master: str | None = None,
                    metadata: str | None = None, timeout_s: float = 1.0,
                    write_through: bool = False) -> PoolTier:
    """The shared pool tier `--pool` asks for (`embedded` or `mooncake`), `size` bytes of it for
    this instance. A Mooncake instance mounts a segment a quarter larger than its share, so the
    master's own eviction (at its high watermark) rarely acts before ours does."""
    nbytes = parse_bytes(size)
    frame = HEADER_SIZE + layout.nbytes
    if nbytes < frame:
        raise ValueError(f"the pool size ({nbytes} bytes) holds no {frame}-byte block")
    options: dict = {}
    if backend == "embedded" and directory is not None:
        options["directory"] = directory
    if backend == "mooncake":
        options.update(master=master, metadata=metadata,
                       segment_bytes=max(MIN_SEGMENT_BYTES, nbytes + nbytes // 4))
    secret = os.environ.get("HINTKV_POOL_SECRET", "").encode()
    return PoolTier(layout, make_backend(backend, frame, **options), nbytes,
                    session_aware=policy == "spm", timeout_s=timeout_s, secret=secret,
                    write_through=write_through)
