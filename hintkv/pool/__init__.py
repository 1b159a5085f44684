"""hintkv.pool: the shared KV pool below the local tiers, where several instances meet.

- `backend.PoolBackend`: the contract of a pool store (batched put / get / exists / remove /
  keep-alive of opaque fixed-size blobs under string keys); `make_backend(name, ...)` by name.
- `embedded.EmbeddedBackend`: no server: in-process, or a shared directory for several
  instances on one machine (the default).
- `mooncake.MooncakeBackend`: Mooncake Store through its Python client (registered buffers,
  batched upserts, lease refresh as keep-alive).
- `master.MooncakeMaster`: start / stop a local `mooncake_master` (`hintkv pool start`).
- `breaker.CircuitBreaker`: timeouts and back-off, so a dead or slow pool degrades to recompute.

The tier that puts a pool behind the `Tier` contract is `hintkv.tiers.pool.PoolTier`; the session
semantics on top of it (SPM) are `hintkv.cache.spm`.
"""

from hintkv.pool.backend import BackendError, PoolBackend, make_backend
from hintkv.pool.breaker import CircuitBreaker

__all__ = ["BackendError", "CircuitBreaker", "PoolBackend", "make_backend"]
