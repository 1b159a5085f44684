"""Content addresses of KV blocks: a chained hash over token ids, rooted in a namespace.

A block's hash covers its parent's hash and its own token ids, so equal hashes mean an identical
prefix up to and including that block. The chain's root is the namespace (model, dtype, block
layout, cache_salt): requests of different namespaces can never share a block, in any tier.
"""

from __future__ import annotations

import hashlib
from array import array

BlockHash = bytes  # 16-byte blake2b digest


def namespace_root(model: str, dtype: str, block_size: int, cache_salt: str | None) -> BlockHash:
    text = f"hintkv-kv-v1|{model}|{dtype}|bs={block_size}|salt={cache_salt or ''}"
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def hash_block(parent: BlockHash, token_ids: list[int]) -> BlockHash:
    # one call over parent + tokens: the same digest as update(parent), update(tokens)
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()


def hash_blocks(root: BlockHash, token_ids: list[int], block_size: int,
                start: int = 0, parent: BlockHash | None = None,
                end: int | None = None) -> list[BlockHash]:
    """Hashes of the full blocks of `token_ids`, from block index `start` (chained on `parent`)
    up to block index `end` (default: every full block)."""
    out: list[BlockHash] = []
    prev = root if start == 0 else parent
    assert prev is not None, "a parent hash is needed to continue a chain"
    full = len(token_ids) // block_size
    for i in range(start, full if end is None else min(end, full)):
        prev = hash_block(prev, token_ids[i * block_size:(i + 1) * block_size])
        out.append(prev)
    return out
