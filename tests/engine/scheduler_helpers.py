"""Helpers for scheduler-level tier tests: 4-token blocks, a namespace, a greedy sequence, and
blocks stored on a tier stack (the payload of block i is filled with i + 1)."""

from __future__ import annotations

import torch

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams

BS = 4
ROOT = namespace_root("test", "float32", BS, None)


def seq_of(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, tokens, len(tokens), SamplingParams(temperature=0, max_tokens=2), ROOT)


def store_blocks(stack, io, tokens: list[int], num_blocks: int) -> list[torch.Tensor]:
    hashes = hash_blocks(ROOT, tokens, BS)[:num_blocks]
    payloads = [torch.full(io.layout.shape, float(i + 1)) for i in range(num_blocks)]
    assert all(f.result() for f in stack.store(list(zip(hashes, payloads))))
    stack.flush()
    return payloads
