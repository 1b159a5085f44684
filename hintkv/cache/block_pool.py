"""The device block pool: which blocks are free, in use, or cached and reclaimable.

Every block is in exactly one of three states:

    | empty (free, no hash) | in use (ref_cnt > 0) | cached (ref_cnt == 0, hash set) |

Cached blocks sit in one bucket per eviction class (`policies.base`): a dict used as an ordered
free queue (insertion order = the order blocks entered the class; O(1) removal from the middle
when a cached block is hit again, which a heap cannot do). Victims are popped from the lowest
non-empty class, front first: O(victims), never a scan or a per-block key. A block changes
bucket when the ranking reports its class changed (a session's state or predicted return moved).

`check_integrity()` states the invariant as code: empty + in use + cached == total, the prefix
index holds exactly the hashed blocks, every cached block sits in the bucket of its current
class, and no block is in two states. Choosing victims changes nothing until they are taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hintkv.cache.block import Block
from hintkv.cache.hashing import BlockHash
from hintkv.cache.policies import EvictionPolicy
from hintkv.cache.ranking import ClassRanking

EvictHook = Callable[[list[Block]], None]


class BlockPool:
    def __init__(self, num_blocks: int, policy: EvictionPolicy,
                 ranking: ClassRanking | None = None) -> None:
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.policy = policy
        self.ranking = ranking if ranking is not None else ClassRanking(policy)
        self.ranking.listeners.append(self._reclassify)
        self._empty: list[int] = list(range(num_blocks - 1, -1, -1))  # stack: pop() gives 0 first
        self._buckets: list[dict[int, Block]] = [{} for _ in range(policy.num_classes)]
        self._num_cached_free = 0
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
        return len(self._empty) + self._num_cached_free

    @property
    def num_cached_free(self) -> int:
        return self._num_cached_free

    @property
    def num_in_use(self) -> int:
        return self.num_blocks - self.num_free

    def num_cached_below(self, cls: int) -> int:
        """Cached unreferenced blocks of classes below `cls` (what a prefetch may take)."""
        return sum(len(b) for b in self._buckets[:cls])

    def lookup(self, h: BlockHash) -> Block | None:
        return self._index.get(h)

    def cached_free_blocks(self) -> list[Block]:
        """Every cached unreferenced block, in victim order."""
        return [b for bucket in self._buckets for b in bucket.values()]

    # ---- ask-then-act --------------------------------------------------------------------
    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int) -> list[Block]:
        """Take `n` blocks: empty ones first, then cached ones in victim order."""
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} blocks, {self.num_free} free")
        out = [self.blocks[self._empty.pop()] for _ in range(min(n, len(self._empty)))]
        if len(out) < n:
            victims = self.choose_victims(n - len(out))
            if self.on_evict is not None:
                self.on_evict(victims)
            for b in victims:
                del self._buckets[b.cls][b.block_id]
                del self._index[b.hash]
                b.hash = None
            self._num_cached_free -= len(victims)
            self.num_evicted += len(victims)
            out.extend(victims)
        now = time.monotonic()
        for b in out:
            b.ref_cnt = 1
            b.last_access = now
        return out

    def choose_victims(self, n: int) -> list[Block]:
        """The `n` cached blocks reclaimed first: lowest class first, front of its bucket first.
        Pure: changes nothing. O(n + classes)."""
        out: list[Block] = []
        for bucket in self._buckets:
            if len(out) >= n:
                break
            for b in bucket.values():
                out.append(b)
                if len(out) >= n:
                    break
        return out

    def touch(self, blocks: list[Block]) -> None:
        """Blocks matched by a new sequence: referenced again (leaving the cached-free set)."""
        now = time.monotonic()
        for b in blocks:
            if b.ref_cnt == 0:
                del self._buckets[b.cls][b.block_id]
                self._num_cached_free -= 1
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
                    b.cls = self.ranking.block_class(b.hash)
                    self._buckets[b.cls][b.block_id] = b
                    self._num_cached_free += 1

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
        del self._buckets[block.cls][block.block_id]
        self._num_cached_free -= 1
        del self._index[block.hash]
        block.hash = None
        self._empty.append(block.block_id)
        return True

    def _reclassify(self, h: BlockHash, cls: int) -> None:
        """Ranking listener: the block holding `h` (if cached here) moves to the back of `cls`."""
        b = self._index.get(h)
        if b is None or b.ref_cnt > 0 or b.cls == cls:
            return
        del self._buckets[b.cls][b.block_id]
        b.cls = cls
        self._buckets[cls][b.block_id] = b

    # ---- invariants ----------------------------------------------------------------------
    def check_integrity(self) -> None:
        empty = set(self._empty)
        cached: set[int] = set()
        for c, bucket in enumerate(self._buckets):
            for bid, b in bucket.items():
                assert b.block_id == bid and b.cls == c, f"block {bid} is in the wrong bucket"
                assert b.cls == self.ranking.block_class(b.hash), \
                    f"cached block {bid} sits in class {c}, its class is now " \
                    f"{self.ranking.block_class(b.hash)}"
                assert bid not in cached, f"block {bid} is in two buckets"
                cached.add(bid)
        assert len(cached) == self._num_cached_free, "cached-free count out of sync"
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
