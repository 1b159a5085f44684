"""SPM, the session-aware pool manager: session semantics for a shared KV pool that knows none.

The pool (`tiers.pool.PoolTier`, the bottom of the tier stack) is a key-value store; SPM is what
makes it follow the agents, on top of what every tier already gets from `TierConnector`:

    what                                   how
    session -> pooled keys tracker         the session registry's `held` lists (ownership by
                                           hash: a shared prefix is one key, held by many)
    publish                                with `--pool-write-through`, a finished request's
                                           full blocks are written through to the pool
                                           (`publish`), so a session resumed on another
                                           instance loads its whole prefix; by default the pool
                                           gets only what no private tier keeps (the lowest
                                           private tier's evictions of live sessions' blocks)
    keep-alive of live sessions            every KEEPALIVE_EVERY_S, ONE batched call refreshes
                                           the pool's lease on every block that an active,
                                           waiting or suspended session holds (`tick`)
    ended sessions handed back             `TierConnector.remove_below` on evict: keys no other live
                                           session holds are released to the pool at once; one
                                           still leased (kept alive a moment ago) is retried each
                                           tick until the lease lapses, live sessions or none
    prefetch on hint / predicted resume    `TierConnector.prefetch` reads through the stack, pool
                                           included
    session-aware pool eviction            the engine's policy ranks the pool's victims
    content keys                           identical blocks from any instance: one key

A pool built with `--pool-policy lru` gets the same puts but none of the rest (no removals, no
keep-alive, LRU victims): the plain store the benchmark compares against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from hintkv.cache.block_pool import BlockPool
from hintkv.cache.hashing import BlockHash
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.pool import PoolTier

KEEPALIVE_EVERY_S = 1.0  # well inside Mooncake's default lease (5 s here)


@dataclass(slots=True)
class SpmCounters:
    num_published: int = 0  # device blocks written through to the pool
    num_keepalive_ticks: int = 0  # batched keep-alive calls sent
    num_pool_prefetched: int = 0  # blocks a prefetch brought up from the pool


class SessionPoolManager:
    def __init__(self, pool: PoolTier, device: BlockPool, io: DeviceBlockIO,
                 held: Callable[[], Iterable[BlockHash]],
                 staging: Callable[[int], torch.Tensor]) -> None:
        """`held()`: every block some live session holds (the cache's ranking knows them)."""
        self.pool = pool
        self.device = device
        self.io = io
        self.held = held
        self._staging = staging
        self.counters = SpmCounters()
        self._last_keepalive = 0.0

    def publish(self, hashes: list[BlockHash]) -> int:
        """Write the device blocks among `hashes` that the pool does not know yet through to
        it (asynchronous; a copy is taken now, so the device blocks may be reused at once).
        With the pool's `write_through` off nothing is published: blocks reach the pool only
        when the lowest private tier (host, or disk) evicts them (a live session's, as to any
        lower tier)."""
        if not self.pool.write_through:
            return 0
        unknown = self.pool.unknown_among(hashes)  # one lock for a prompt's thousands of blocks
        fresh = [(h, b) for h, b in zip(unknown, self.device.lookup_many(unknown)) if b is not None]
        if not fresh:
            return 0
        staging = self._staging(len(fresh))
        self.io.read([b.block_id for _, b in fresh], staging)
        self.pool.put([(h, staging[i]) for i, (h, _) in enumerate(fresh)])
        self.counters.num_published += len(fresh)
        return len(fresh)

    def tick(self, now: float) -> None:
        """Once per engine step; does work every KEEPALIVE_EVERY_S: the blocks any live (not
        ended) session holds that the pool knows, in one pass over the held set."""
        if not self.pool.session_aware or now - self._last_keepalive < KEEPALIVE_EVERY_S:
            return
        self._last_keepalive = now
        if self.pool.keep_alive(self.held(), known_only=True):  # its pass also retries held-back releases
            self.counters.num_keepalive_ticks += 1
        else:  # nothing live to keep: an ended session's blocks still go back once their lease lapses
            self.pool.retry_releases()

    def quiet(self, now: float) -> bool:
        """`tick(now)` would do nothing (a driver may skip it: the simulator's decode stretches)."""
        return not self.pool.session_aware or now - self._last_keepalive < KEEPALIVE_EVERY_S

    def stats(self) -> dict:
        c = self.counters
        return {**self.pool.pool_stats(), "published": c.num_published,
                "keepalive_ticks": c.num_keepalive_ticks, "prefetched": c.num_pool_prefetched,
                "policy": "spm" if self.pool.session_aware else "lru"}
