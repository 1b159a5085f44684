"""The pool tests' block helpers: a tiny bfloat16 layout, its frame size, deterministic keys
and payloads, and a bit-exact comparison."""

from __future__ import annotations

import hashlib

import torch

from hintkv.tiers.disk_format import HEADER_SIZE
from hintkv.tiers.layout import BlockLayout

LAYOUT = BlockLayout(num_layers=2, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.bfloat16)
FRAME = HEADER_SIZE + LAYOUT.nbytes


def key(i: int) -> bytes:
    return hashlib.blake2b(f"block-{i}".encode(), digest_size=16).digest()


def payload(i: int) -> torch.Tensor:
    return torch.randn(LAYOUT.shape, generator=torch.Generator().manual_seed(i)).to(LAYOUT.dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))
