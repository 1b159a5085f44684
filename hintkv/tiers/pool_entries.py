"""The pool tier's records: an index entry per known block, a put call's batch, the counters,
and the error every failed pool call turns into (`tiers.pool.PoolTier` keeps them)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass


class Unavailable(Exception):
    """The pool is not reachable now (breaker open, timeout, backend error)."""


@dataclass(slots=True)
class PoolEntry:
    last_access: int  # logical clock of the last put / get / keep-alive
    write: Future[bool]  # the put that stores it (one per `put` call, shared by its new blocks)
    owned: bool  # stored by this instance (False: found there already, or only read from there)
    pkey: str  # its pool key, made once (keep-alive sends it every second; its hash is cached)
    stored: bool = True  # its own put succeeded (False while it runs, and if it failed)

    @property
    def ready(self) -> bool:
        return self.stored and self.write.done()


@dataclass(slots=True)
class PutBatch:
    """The new blocks of one `put` call: ONE future, True once every one of them is stored
    (False if any failed; each entry's own outcome is `PoolEntry.stored`)."""

    write: Future[bool]
    left: int = 0  # blocks not processed yet
    ok: bool = True


@dataclass(slots=True)
class PoolCounters:
    """Pool-specific counters (monotonic), next to the tier's `TierStats`."""

    num_dedup: int = 0  # puts skipped: the pool held the key already (content keys)
    num_remote_hits: int = 0  # hits on blocks this instance did not store
    bytes_put: int = 0
    bytes_got: int = 0
    num_put_calls: int = 0  # batched backend calls
    num_get_calls: int = 0
    num_keepalive_calls: int = 0
    num_keepalive_keys: int = 0
    num_unavailable: int = 0  # operations skipped or failed because the pool was unreachable
    peak_bytes: int = 0  # the most `bytes_used` has been
    num_released: int = 0  # ended sessions' blocks and capacity victims removed from the pool
    num_release_leased: int = 0  # release attempts refused: another instance kept the block alive
    num_lost: int = 0  # blocks this instance stored that the pool lost (a master restarted): forgotten
