"""Content addresses of KV blocks: a chained hash over token ids, rooted in a namespace.

A block's hash covers its parent's hash and its own token ids, so equal hashes mean an identical
prefix up to and including that block. The chain's root is the namespace (model, dtype, block
layout, cache_salt): requests of different namespaces can never share a block, in any tier.

The digest is blake2b-128 of the parent's 16 bytes followed by the block's token ids as native
signed 64-bit integers (`array("q")`): lower tiers (disk, the shared pool) keep blocks under it
across restarts, so it never changes (tests/cache/test_hashing.py pins it).
"""

from __future__ import annotations

import struct
from array import array
from hashlib import blake2b

BlockHash = bytes  # 16-byte blake2b digest

_packers: dict[int, struct.Struct] = {}  # tokens per block -> its packer (native int64, as array "q")


def namespace_root(model: str, dtype: str, block_size: int, cache_salt: str | None) -> BlockHash:
    text = f"hintkv-kv-v1|{model}|{dtype}|bs={block_size}|salt={cache_salt or ''}"
    return blake2b(text.encode(), digest_size=16).digest()


def hash_block(parent: BlockHash, token_ids: list[int]) -> BlockHash:
    # one call over parent + tokens (the same digest as update(parent), update(tokens)); the
    # tokens packed by a cached Struct: a decode step's commit hashes one block per sequence
    # crossing a boundary, and building an array per block was 40% of the hash (measured)
    pack = _packers.get(len(token_ids))
    if pack is None:
        pack = _packers[len(token_ids)] = struct.Struct(f"={len(token_ids)}q")
    return blake2b(parent + pack.pack(*token_ids), digest_size=16).digest()


def hash_blocks(root: BlockHash, token_ids: list[int], block_size: int,
                start: int = 0, parent: BlockHash | None = None,
                end: int | None = None) -> list[BlockHash]:
    """Hashes of the full blocks of `token_ids`, from block index `start` (chained on `parent`)
    up to block index `end` (default: every full block). The tokens are converted to bytes once
    for all the blocks (a prompt's thousands of blocks: not one array per block)."""
    prev = root if start == 0 else parent
    assert prev is not None, "a parent hash is needed to continue a chain"
    full = len(token_ids) // block_size
    stop = full if end is None else min(end, full)
    if stop <= start:
        return []
    data = array("q", token_ids[start * block_size:stop * block_size]).tobytes()
    width = 8 * block_size
    out: list[BlockHash] = []
    keep = out.append
    for i in range(0, len(data), width):
        prev = blake2b(prev + data[i:i + width], digest_size=16).digest()
        keep(prev)
    return out
