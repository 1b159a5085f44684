"""The contract of a KV pool store, and the registry of backends by name.

A backend stores opaque blobs of one fixed size (a framed KV block: header + payload, see
`hintkv.tiers.pool`) under string keys. Every call is batched: one round trip for many keys.
Keys are content keys (the block's chained hash), so identical blocks written by different
instances land on the same key and are stored once.

Semantics every backend keeps (the contract tests in tests/pool run all of them):
  - `put(keys, blobs)`: store each blob, overwriting (upsert); per key True when stored.
  - `get(keys, dsts)`: fill each uint8 `dst` with the blob; per key True on a hit, False on a
    miss (unknown key, wrong size). The content of a missed `dst` is undefined.
  - `exists(keys)`: per key True if stored (a probe: it does not extend a lease).
  - `remove(keys)`: forget the keys now (even if recently read); per key True if it was there.
  - `release(keys)`: remove the keys nobody has kept alive or read within the lease time; per
    key True (removed), False (not there) or None (leased: in use elsewhere, try again later).
    This is how an instance hands back an ended session's blocks without taking them from a
    live session on another instance.
  - `keep_alive(keys)`: tell the store these keys are in use (refresh leases, touch LRU order);
    per key True if it was there (the tier forgets a block it stored that the pool lost). One
    call per batch: this is what makes keep-alive cheap.
  - `used_bytes()`: bytes the store holds in all (None if it cannot tell).
A call that cannot reach the store raises `BackendError` (the caller's circuit breaker counts
it); a miss is not an error.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class BackendError(RuntimeError):
    """The pool store could not be reached or refused the call (not a miss)."""


class PoolBackend(ABC):
    name = "backend"

    @abstractmethod
    def put(self, keys: list[str], blobs: list[torch.Tensor]) -> list[bool]: ...

    @abstractmethod
    def get(self, keys: list[str], dsts: list[torch.Tensor]) -> list[bool]: ...

    @abstractmethod
    def exists(self, keys: list[str]) -> list[bool]: ...

    @abstractmethod
    def remove(self, keys: list[str]) -> list[bool]: ...

    @abstractmethod
    def release(self, keys: list[str]) -> list[bool | None]: ...

    @abstractmethod
    def keep_alive(self, keys: list[str]) -> list[bool]: ...

    def used_bytes(self) -> int | None:
        return None

    def close(self) -> None:
        """Release connections and buffers. Stored blobs stay (others may use them)."""


def make_backend(name: str, blob_nbytes: int, **options) -> PoolBackend:
    """A backend by name: `embedded` (options: `directory`) or `mooncake` (options: `master`,
    `metadata`, `segment_bytes`, ...). Heavy client libraries are imported only when used."""
    if name == "embedded":
        from hintkv.pool.embedded import EmbeddedBackend
        return EmbeddedBackend(blob_nbytes, **options)
    if name == "mooncake":
        from hintkv.pool.mooncake import MooncakeBackend
        return MooncakeBackend(blob_nbytes, **options)
    raise ValueError(f"unknown pool backend {name!r} (embedded, mooncake)")
