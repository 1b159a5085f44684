"""Fixtures for the tier tests: a tiny block layout, deterministic keys and payloads."""

from __future__ import annotations

import hashlib

import pytest
import torch

from hintkv.tiers.layout import BlockLayout


def make_key(i: int) -> bytes:
    return hashlib.blake2b(f"block-{i}".encode(), digest_size=16).digest()


def make_payload(layout: BlockLayout, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layout.shape, generator=g).to(layout.dtype)


@pytest.fixture
def layout() -> BlockLayout:
    return BlockLayout(num_layers=2, block_size=4, num_kv_heads=2, head_dim=8,
                       dtype=torch.bfloat16)


@pytest.fixture
def key():
    return make_key


@pytest.fixture
def payload(layout):
    return lambda seed: make_payload(layout, seed)


@pytest.fixture
def empty(layout):
    """A fresh destination tensor for one block."""
    return lambda: torch.empty(layout.shape, dtype=layout.dtype)
