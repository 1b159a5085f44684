"""The device block pool: which blocks are free, in use, or cached and reclaimable.

Every block is in exactly one of three states:

    | empty (free, no hash) | in use (ref_cnt > 0) | cached (ref_cnt == 0, hash set) |

Cached blocks sit in one bucket per eviction class (`policies.base`). Inside a bucket, one NODE
per group of blocks (`cache.ranking`: the blocks the same sessions hold, e.g. one session's own
context), least recently used node first; inside a node, blocks in the order they were released
(a sequence releases tail first, so a session's tail goes before its head), each release's
consecutive blocks of one group filed as ONE run (`cache.block_runs`: a release or a re-match
costs a store per block, not dict entries). Nodes and buckets are dicts used as ordered queues,
a block hit again leaves its run in O(1) (which a heap cannot do). Victims are popped from the
lowest non-empty class, front node first,
front block first: O(victims), never a scan or a per-block key. A session changing class moves
its group's node to the back of another bucket: O(1), whatever the number of blocks. Under a
policy without sessions (`lru`) there is one node per class: plain LRU.

`check_integrity()` states the invariant as code: empty + in use + cached == total, the prefix
index holds exactly the hashed blocks, every cached block sits in the node of its group and the
bucket of its current class, and no block is in two states. Choosing victims changes nothing
until they are taken.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import groupby, takewhile
from operator import attrgetter

from hintkv.cache.block import Block
from hintkv.cache.block_runs import BlockRuns
from hintkv.cache.hashing import BlockHash
from hintkv.cache.policies import EvictionPolicy
from hintkv.cache.policies.base import UNHELD
from hintkv.cache.ranking import ClassRanking

_hash_of, _group_of = attrgetter("hash"), attrgetter("group")
UNINDEX_LOG_MAX = 1 << 16  # unindexed hashes kept for cached prefix matches (`KVCacheManager`)

EvictHook = Callable[[list[Block]], None]


class BlockPool:
    def __init__(self, num_blocks: int, policy: EvictionPolicy) -> None:
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.policy = policy
        # its own ranking, never shared: a group links ONE pool's node (`Group.node`), so a
        # second pool's `BlockRuns` on the same ranking would unlink the first pool's nodes
        self.ranking = ClassRanking(policy)
        self.ranking.listeners.append(self)
        self._grouped = self.ranking.grouped
        self._empty: list[int] = list(range(num_blocks - 1, -1, -1))  # stack: pop() gives 0 first
        self._cached = BlockRuns()  # class -> group node -> runs of blocks (`cache.block_runs`)
        if self._grouped:  # a group changing class moves its node here (`ClassRanking`)
            self.ranking.node_order = self._cached
        self._index: dict[BlockHash, Block] = {}
        self.on_evict: EvictHook | None = None  # called with victims before their KV is reused
        self.num_evicted = 0
        # hashes that left the index, in order (`unindexed_since`: what a cached prefix match
        # must check); cleared past UNINDEX_LOG_MAX entries, which bumps `unindex_epoch`
        self._unindexed: list[BlockHash] = []
        self.unindex_epoch = 0
        # bumped by every call that may change a block's ref_cnt (allocate, touch, release: the only
        # writers), after its writes: the key of `KVCacheManager.free_room`'s kept count
        self.ref_epoch = 0

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (empty + cached-unreferenced)."""
        return len(self._empty) + len(self._cached)

    @property
    def num_cached_free(self) -> int:
        return len(self._cached)

    @property
    def num_in_use(self) -> int:
        return self.num_blocks - self.num_free

    def num_cached_below(self, cls: int) -> int:
        """Cached unreferenced blocks of classes below `cls` (what a prefetch may take)."""
        self.ranking.settle()
        return self._cached.count_below(cls)

    def lookup(self, h: BlockHash) -> Block | None:
        return self._index.get(h)

    def lookup_many(self, hashes: list[BlockHash]) -> list[Block | None]:
        """`lookup` of each hash, in one pass."""
        return list(map(self._index.get, hashes))

    def class_of(self, b: Block) -> int:
        """The class of the bucket a cached unreferenced block sits in."""
        self.ranking.settle()
        return self._cached.class_of(b)

    def cached_free_blocks(self) -> list[Block]:
        """Every cached unreferenced block, in victim order."""
        self.ranking.settle()
        return list(self._cached.victims())

    def leading_run(self, hashes: list[BlockHash]) -> list[Block]:
        """The blocks of the longest prefix of `hashes` in the index (a prefix match). Runs in C:
        a waiting 100K-token prompt is re-matched every step it waits (a Python loop over its
        6K hashes took 80% of a 100-user full-scale simulation, py-spy)."""
        return list(takewhile(bool, map(self._index.get, hashes)))  # a Block is always truthy

    def unindexed_since(self, epoch: int, seen: int) -> list[BlockHash] | None:
        """Hashes that left the index since a reader at (`epoch`, `seen`) last looked; None:
        the log was cleared since (the reader must look again from scratch)."""
        return self._unindexed[seen:] if epoch == self.unindex_epoch else None

    @property
    def unindex_mark(self) -> tuple[int, int]:
        """(epoch, position) of the unindex log now: where a reader continues from."""
        return self.unindex_epoch, len(self._unindexed)

    def _log_unindexed(self, hashes: list[BlockHash]) -> None:
        if len(self._unindexed) + len(hashes) > UNINDEX_LOG_MAX:
            self._unindexed = []
            self.unindex_epoch += 1
        self._unindexed.extend(hashes)

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
            hashes = list(map(_hash_of, victims))
            self._log_unindexed(hashes)
            self._cached.remove_many(victims)
            index = self._index
            for b, h in zip(victims, hashes):
                del index[h]
                b.hash = None
            self.num_evicted += len(victims)
            out.extend(victims)
        for b in out:
            b.ref_cnt = 1
        self.ref_epoch += 1  # after the writes (and the hook): a count taken meanwhile goes stale
        return out

    def choose_victims(self, n: int) -> list[Block]:
        """The `n` cached blocks reclaimed first: lowest class first, front node of its bucket
        first, front block of the node first. Pure: changes nothing. O(n + classes)."""
        if n <= 0:
            return []
        self.ranking.settle()  # moves an arrival left pending (`ClassRanking.settle`)
        return self._cached.first(n)

    def touch(self, blocks: list[Block]) -> None:
        """Blocks matched by a new sequence: referenced again (leaving the cached-free set)."""
        cached = []
        keep = cached.append
        for b in blocks:  # one pass (a 100K-token prompt matches thousands of blocks)
            n = b.ref_cnt
            if not n:
                keep(b)
            b.ref_cnt = n + 1
        self.ref_epoch += 1
        if cached:
            self._cached.remove_many(cached)

    def release(self, blocks: list[Block]) -> None:
        """A sequence lets go of its blocks; the last block first so prefixes outlive suffixes.
        Consecutive cached blocks of one group are filed as one run; empty ones in between do
        not break a run. One pass sorts the blocks that come free into cached and empty."""
        cached: list[Block] = []
        keep = cached.append
        empty: list[int] = []
        for b in reversed(blocks):
            n = b.ref_cnt - 1
            if n:
                if n < 0:
                    raise AssertionError(f"block {b.block_id} released twice")
                b.ref_cnt = n
            else:
                b.ref_cnt = 0
                if b.hash is None:
                    empty.append(b.block_id)
                else:
                    keep(b)
        self.ref_epoch += 1
        if empty:
            self._empty.extend(empty)
        if not cached:
            return
        self.ranking.settle()  # nodes are refiled at the back of their class: it must be current
        groups = list(map(_group_of, cached))  # (kept on each indexed block: `block_moved`)
        if groups.count(groups[0]) == len(groups):  # one group (a session's own context): one run
            self._file_run(cached, groups[0])
            return
        i = 0  # runs of one group (a context: its own part, then the shared prompt's)
        for g, run in groupby(groups):
            n = len(list(run))
            self._file_run(cached[i:i + n], g)
            i += n

    def register(self, block: Block, h: BlockHash) -> bool:
        """Index a full in-use block under its hash; False if another block already has it."""
        assert block.ref_cnt > 0 and block.hash is None
        if h in self._index:
            return False
        block.hash = h
        block.group = self.ranking.group_of(h)
        self._index[h] = block
        return True

    def drop(self, block: Block) -> bool:
        """Free a cached, unreferenced block at once (its KV is forgotten). False if in use."""
        if block.ref_cnt > 0 or block.hash is None:
            return False
        self._cached.remove(block)
        del self._index[block.hash]
        self._log_unindexed([block.hash])
        block.hash = None
        self._empty.append(block.block_id)
        return True

    # ---- nodes: a cached block sits in its group's node, the node in its class's bucket ------
    def _file(self, b: Block, group: int, front: bool = False) -> None:
        """File `b` in its group's node (one node for all under a policy without sessions); the
        node is linked to the ranking's group (`Group.node`: a walk skips a group without one)."""
        if not self._grouped:
            self._cached.add(b, 0, self.ranking.group_class(group), front)
            return
        g = self.ranking.group(group)
        self._cached.add(b, group, UNHELD if g is None else g.top, front, g)

    def _file_run(self, blocks: list[Block], group: int) -> None:
        """`_file` of consecutive blocks of one group, in order, as one run (takes the list)."""
        if not self._grouped:
            self._cached.add_run(blocks, 0, self.ranking.group_class(group))
            return
        g = self.ranking.group(group)
        self._cached.add_run(blocks, group, UNHELD if g is None else g.top, g)

    def block_moved(self, h: BlockHash, group: int, cls: int) -> None:
        """Ranking listener: the block holding `h` (if cached here) joins another group (at its
        front: tail before head)."""
        b = self._index.get(h)
        if b is None:
            return
        b.group = group
        if b.ref_cnt > 0 or not self._grouped:
            return
        self._cached.remove(b)
        # a block joining a session's group extends it at the tail (the ranking reports them
        # head first): reclaimed before the blocks the group held already
        self._file(b, group, front=group != 0)

    # ---- invariants ----------------------------------------------------------------------
    def check_integrity(self) -> None:
        self.ranking.settle()
        empty = set(self._empty)
        self._cached.check_integrity(self.ranking.groups())
        cached: set[int] = set()
        for b, node, c in self._cached.items():
            bid = b.block_id
            want = self.ranking.group_of(b.hash) if self._grouped else 0
            assert node == want, f"cached block {bid} sits in node {node}, its group is {want}"
            assert c == self.ranking.block_class(b.hash), \
                f"cached block {bid} sits in class {c}, its class is now " \
                f"{self.ranking.block_class(b.hash)}"
            cached.add(bid)
        for h, b in self._index.items():
            assert b.group == self.ranking.group_of(h), f"block {b.block_id} keeps a stale group"
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
        assert all((b.run is not None) == (b.block_id in cached) for b in self.blocks), \
            "a block's run disagrees with its state (only cached blocks sit in a run)"
        hashed = {b.block_id for b in self.blocks if b.hash is not None}
        assert hashed == {b.block_id for b in self._index.values()}, "prefix index out of sync"
        for h, b in self._index.items():
            assert b.hash == h, f"index entry of block {b.block_id} has the wrong hash"
