"""Mooncake Store as the pool, through its Python client (`mooncake-transfer-engine-non-cuda`).

    MooncakeBackend(blob_nbytes, master="127.0.0.1:50051",
                    metadata="http://127.0.0.1:8080/metadata", segment_bytes=1 << 30)

Each instance mounts a segment of `segment_bytes` into the pool (the pool's capacity is the sum
over instances) and registers one staging arena with the transfer engine: every batch is copied
into (or read out of) that arena and moved with one `batch_upsert_from` / `batch_get_into` call
(about 3x faster than single puts here). Known behaviour designed around:
  - `put` on an existing key is a silent no-op: we always upsert.
  - a key read or kept alive holds a lease (`default_kv_lease_ttl`) and cannot be removed until
    it ends: `release` (an ended session's blocks) respects leases, so a block another
    instance's live session keeps alive stays; `remove` (eviction, corruption) forces. A reader
    racing a forced removal gets a torn blob at worst, which the tier's MAC turns into a miss.
  - a full segment answers -200: a refused put (the tier evicts first, so this is rare).
  - keep-alive is `batch_get_replica_desc`: one metadata call that grants each key a fresh lease,
    so the master's own eviction passes over live sessions' blocks; no data moves.
  - with the master gone, calls answer RPC_FAIL (-900) fast or hang (an upsert waited 4 s):
    callers wrap them in timeouts and a circuit breaker (`hintkv.tiers.pool`); the client
    re-mounts its segment by itself when a master is back on the same address.
"""

from __future__ import annotations

import socket
import threading

import torch

from hintkv.pool.backend import BackendError, PoolBackend

NOT_FOUND = -704
FULL = -200
HAS_LEASE = -706
ARENA_BYTES = 32 << 20  # registered staging; batches are cut to fit
MIN_SEGMENT_BYTES = 16 << 20  # the client refuses a smaller segment


def _failed(code: int) -> bool:
    """A code that means the store was not reached (as opposed to a per-key outcome)."""
    return code <= -900 or code == -1


class MooncakeBackend(PoolBackend):
    name = "mooncake"

    def __init__(self, blob_nbytes: int, master: str, metadata: str | None = None,
                 segment_bytes: int = 1 << 30, local_host: str = "127.0.0.1",
                 protocol: str = "tcp") -> None:
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:  # the wheel, or Debian's libibverbs1, is missing
            raise BackendError(
                "the mooncake backend needs `pip install mooncake-transfer-engine-non-cuda` "
                f"and `apt-get install libibverbs1`: {e}") from e
        self.blob_nbytes = blob_nbytes
        self.master = master
        self.metadata = metadata or f"http://{master.rsplit(':', 1)[0]}:8080/metadata"
        self._store = MooncakeDistributedStore()
        rc = self._store.setup(local_host, self.metadata, segment_bytes, 16 << 20, protocol, "",
                               master)
        if rc != 0:
            raise BackendError(f"cannot join the Mooncake pool at {master} (setup returned {rc})")
        self.slots = max(1, ARENA_BYTES // blob_nbytes)
        self._arena = torch.zeros(self.slots, blob_nbytes, dtype=torch.uint8)
        rc = self._store.register_buffer(self._arena.data_ptr(), self._arena.numel())
        if rc != 0:
            self._store.close()
            raise BackendError(f"cannot register the staging buffer (returned {rc})")
        self._lock = threading.Lock()  # one user of the arena at a time
        self._closed = False
        self.hostname = socket.gethostname()

    def _ptrs(self, n: int) -> list[int]:
        base, step = self._arena.data_ptr(), self.blob_nbytes
        return [base + i * step for i in range(n)]

    def put(self, keys: list[str], blobs: list[torch.Tensor]) -> list[bool]:
        out: list[bool] = []
        with self._lock:
            for start in range(0, len(keys), self.slots):
                chunk = keys[start:start + self.slots]
                for i, blob in enumerate(blobs[start:start + self.slots]):
                    self._arena[i].copy_(blob)
                codes = self._store.batch_upsert_from(chunk, self._ptrs(len(chunk)),
                                                      [self.blob_nbytes] * len(chunk))
                if any(_failed(c) for c in codes):
                    raise BackendError(f"upsert failed: {sorted(set(codes))}")
                out += [c == 0 for c in codes]
        return out

    def get(self, keys: list[str], dsts: list[torch.Tensor]) -> list[bool]:
        out: list[bool] = []
        with self._lock:
            for start in range(0, len(keys), self.slots):
                chunk = keys[start:start + self.slots]
                codes = self._store.batch_get_into(chunk, self._ptrs(len(chunk)),
                                                   [self.blob_nbytes] * len(chunk))
                if any(_failed(c) for c in codes):
                    raise BackendError(f"get failed: {sorted(set(codes))}")
                for i, (code, dst) in enumerate(zip(codes, dsts[start:start + self.slots])):
                    ok = code == self.blob_nbytes
                    if ok:
                        dst.copy_(self._arena[i])
                    out.append(ok)
        return out

    def exists(self, keys: list[str]) -> list[bool]:
        if not keys:
            return []
        codes = self._store.batch_is_exist(keys)
        if any(c < 0 for c in codes):
            raise BackendError(f"exists failed: {sorted(set(codes))}")
        return [c == 1 for c in codes]

    def remove(self, keys: list[str]) -> list[bool]:
        if not keys:
            return []
        codes = self._store.batch_remove(keys, True)
        if any(_failed(c) for c in codes):
            raise BackendError(f"remove failed: {sorted(set(codes))}")
        return [c == 0 for c in codes]

    def release(self, keys: list[str]) -> list[bool | None]:
        if not keys:
            return []
        codes = self._store.batch_remove(keys, False)
        if any(_failed(c) for c in codes):
            raise BackendError(f"remove failed: {sorted(set(codes))}")
        return [None if c == HAS_LEASE else c == 0 for c in codes]

    def keep_alive(self, keys: list[str]) -> list[bool]:
        if not keys:
            return []
        try:
            found = self._store.batch_get_replica_desc(keys)
        except Exception as e:  # the binding raises on RPC failure
            raise BackendError(f"keep-alive failed: {e}") from e
        return [bool(found.get(k)) for k in keys]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._store.unregister_buffer(self._arena.data_ptr())
        finally:
            self._store.close()
