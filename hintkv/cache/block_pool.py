"""The device block pool: which blocks are free, in use, or cached and reclaimable.

Every block is in exactly one of three states:

    | empty (free, no hash) | in use (ref_cnt > 0) | cached (ref_cnt == 0, hash set) |

`check_integrity()` states the invariant as code: empty + in use + cached == total, the prefix
index holds exactly the hashed blocks, and no block is in two states. Cached blocks are reclaimed
in the order an eviction policy gives (smallest key first); choosing victims changes nothing until
they are taken.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

from hintkv.cache.block import Block
from hintkv.cache.hashing import BlockHash
from hintkv.cache.policies import EvictionPolicy

EvictHook = Callable[[list[Block]], None]


class BlockPool:
    def __init__(self, num_blocks: int, policy: EvictionPolicy) -> None:
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.policy = policy
        self._empty: list[int] = list(range(num_blocks - 1, -1, -1))  # stack: pop() gives 0 first
        # dict rather than a heap: O(1) removal from the middle when a cached block is hit again;
        # insertion order is the order blocks became reclaimable (= LRU order).
        self._cached_free: dict[int, Block] = {}
        self._index: dict[BlockHash, Block] = {}
        self.on_evict: EvictHook | None = None  # called with victims before their KV is reused
        self.num_evicted = 0

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (empty + cached-unreferenced)."""
        return len(self._empty) + len(self._cached_free)

    @property
    def num_cached_free(self) -> int:
        return len(self._cached_free)

    @property
    def num_in_use(self) -> int:
        return self.num_blocks - self.num_free

    def lookup(self, h: BlockHash) -> Block | None:
        return self._index.get(h)

    def cached_free_blocks(self) -> list[Block]:
        return list(self._cached_free.values())

    # ---- ask-then-act --------------------------------------------------------------------
    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int) -> list[Block]:
        """Take `n` blocks: empty ones first, then cached ones in policy order."""
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} blocks, {self.num_free} free")
        out = [self.blocks[self._empty.pop()] for _ in range(min(n, len(self._empty)))]
        if len(out) < n:
            victims = self.choose_victims(n - len(out))
            if self.on_evict is not None:
                self.on_evict(victims)
            for b in victims:
                del self._cached_free[b.block_id]
                del self._index[b.hash]
                b.hash = None
            self.num_evicted += len(victims)
            out.extend(victims)
        now = time.monotonic()
        for b in out:
            b.ref_cnt = 1
            b.last_access = now
        return out

    def choose_victims(self, n: int) -> list[Block]:
        """The `n` cached blocks the policy would reclaim first. Pure: changes nothing."""
        if self.policy.lru_order:
            it = iter(self._cached_free.values())
            return [next(it) for _ in range(n)]
        self.policy.prepare()
        return heapq.nsmallest(n, self._cached_free.values(), key=self.policy.key)

    def touch(self, blocks: list[Block]) -> None:
        """Blocks matched by a new sequence: referenced again (leaving the cached-free set)."""
        now = time.monotonic()
        for b in blocks:
            if b.ref_cnt == 0:
                self._cached_free.pop(b.block_id)
            b.ref_cnt += 1
            b.last_access = now

    def release(self, blocks: list[Block]) -> None:
        """A sequence lets go of its blocks; the last block first so prefixes outlive suffixes."""
        now = time.monotonic()
        for b in reversed(blocks):
            assert b.ref_cnt > 0, f"block {b.block_id} released twice"
            b.ref_cnt -= 1
            b.last_access = now
            if b.ref_cnt == 0:
                if b.hash is None:
                    self._empty.append(b.block_id)
                else:
                    self._cached_free[b.block_id] = b

    def register(self, block: Block, h: BlockHash) -> bool:
        """Index a full in-use block under its hash; False if another block already has it."""
        assert block.ref_cnt > 0 and block.hash is None
        if h in self._index:
            return False
        block.hash = h
        self._index[h] = block
        return True

    def drop(self, block: Block) -> bool:
        """Free a cached, unreferenced block at once (its KV is forgotten). False if in use."""
        if block.ref_cnt > 0 or block.hash is None:
            return False
        del self._cached_free[block.block_id]
        del self._index[block.hash]
        block.hash = None
        self._empty.append(block.block_id)
        return True

    # ---- invariants ----------------------------------------------------------------------
    def check_integrity(self) -> None:
        empty = set(self._empty)
        cached = set(self._cached_free)
        in_use = {b.block_id for b in self.blocks if b.ref_cnt > 0}
        assert len(empty) == len(self._empty), "a block is twice in the empty list"
        assert not (empty & cached) and not (empty & in_use) and not (cached & in_use), \
            "a block is in two states"
        assert len(empty) + len(cached) + len(in_use) == self.num_blocks, \
            f"free {len(empty)} + cached {len(cached)} + in use {len(in_use)} != {self.num_blocks}"
        for bid in empty:
            b = self.blocks[bid]
            assert b.hash is None and b.ref_cnt == 0, f"empty block {bid} has state"
        for bid in cached:
            b = self.blocks[bid]
            assert b.hash is not None and b.ref_cnt == 0, f"cached block {bid} has no hash"
        hashed = {b.block_id for b in self.blocks if b.hash is not None}
        assert hashed == {b.block_id for b in self._index.values()}, "prefix index out of sync"
        for h, b in self._index.items():
            assert b.hash == h, f"index entry of block {b.block_id} has the wrong hash"
