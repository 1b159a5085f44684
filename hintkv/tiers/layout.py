"""The shape of one KV block as it moves between tiers: all layers of one block, K and V.

The device cache keeps, per layer, one tensor `[2, num_blocks, block_size, num_kv_heads, head_dim]`;
a block leaving the device is gathered across layers into `[num_layers, 2, block_size,
num_kv_heads, head_dim]` (see `device.py`). Every tier stores exactly this payload, so a block's
bytes are identical on every tier and a checksum taken on one holds on all. With
`--kv-cache-dtype int8 | fp8` a row is head_dim value bytes + a float32 scale (`models/kv_quant.py`):
`head_dim` here is then the row's width and `dtype` int8 / uint8, so the scales travel inside the
payload and the fingerprint tells the formats apart (a block of another format is a miss).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass(slots=True, frozen=True)
class BlockLayout:
    num_layers: int
    block_size: int  # tokens per block
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        for name in ("num_layers", "block_size", "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {self.dtype!r}")

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one block's payload: `[num_layers, 2, block_size, num_kv_heads, head_dim]`."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def numel(self) -> int:
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim

    @property
    def nbytes(self) -> int:
        """Bytes of one block's payload."""
        return self.numel * self.dtype.itemsize

    def fingerprint(self) -> bytes:
        """16 bytes that differ whenever the payload's meaning differs (shape or dtype)."""
        text = f"{self.shape}|{self.dtype}".encode()
        return hashlib.blake2b(text, digest_size=16).digest()

    def check_payload(self, t: torch.Tensor) -> None:
        """Raise ValueError unless `t` is exactly one block's payload."""
        if tuple(t.shape) != self.shape or t.dtype != self.dtype:
            raise ValueError(f"payload {tuple(t.shape)} {t.dtype} does not match "
                             f"layout {self.shape} {self.dtype}")
