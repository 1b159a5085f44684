"""The device pool's cached blocks in victim order, a RUN of blocks filed together as one unit.

The order is `tiers.order.ClassedLRU`'s, exactly (tests/cache/test_block_runs.py checks it
against that structure): one bucket per class (lowest reclaimed first), one node per ranking
group in it (least recently used first), the node's blocks in the order they were filed (a
released sequence files tail first). What differs is the unit of work:

    bucket per class ─ node per group ─ runs, in filing order ─ blocks of a run, in order
                                          └ a release of consecutive blocks of one group

A release files its run with one store per block (`Block.run`) and one dict insertion for the
run, instead of a dict entry per block in the node and another in a key -> node map (those were
most of a release: 23% of `bench cache`'s 1M-token step, py-spy). Taking a block out (a prefix
matched again, a victim) clears its `run` and counts the run down; a run whose blocks all left
is dropped from its node (O(1)). A block's entry in a run is valid while `block.run is run`:
entries of blocks that left stay in the run's list and are skipped (and trimmed from its head)
when victims are read. A block enters a run once: back filings always start a new run; front
filings (a block joining a group at its head) extend the node's first run only if it is a front
run nothing ever left (`clean`), so no run can list a block twice.

Not thread-safe: the pool's owner (the engine thread, under its state lock) guards it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from hintkv.cache.block import Block

if TYPE_CHECKING:
    from hintkv.cache.group_walk import Group


class _Run:
    """Blocks filed together (valid entries: `b.run is self`). `front`: filed at the node's head
    one at a time, so its list is in REVERSE victim order (the newest at the end)."""

    __slots__ = ("node", "blocks", "start", "live", "front", "clean")

    def __init__(self, node: _Node, blocks: list[Block], front: bool = False) -> None:
        self.node = node
        self.blocks = blocks  # owned by the run
        self.start = 0  # forward runs: entries before it are stale (trimmed by `blocks_in`)
        self.live = len(blocks)
        self.front = front
        self.clean = True  # no block has left it (a front run may grow only while clean)

    def blocks_in(self) -> Iterator[Block]:
        """Its valid blocks in victim order; stale entries at its head are trimmed."""
        blocks = self.blocks
        if self.front:
            while blocks and blocks[-1].run is not self:
                blocks.pop()
            return (b for b in reversed(blocks) if b.run is self)
        i, n = self.start, len(blocks)
        while i < n and blocks[i].run is not self:
            i += 1
        self.start = i
        return (b for b in islice(blocks, i, None) if b.run is self)


class _Node:
    __slots__ = ("gid", "cls", "runs", "count", "group")

    def __init__(self, gid: int, cls: int, group: Group | None) -> None:
        self.gid = gid
        self.cls = cls
        self.runs: dict[_Run, None] = {}  # in victim order (front runs are re-inserted first)
        self.count = 0  # valid blocks in its runs
        self.group = group  # the ranking's group `gid` (None: filed without one), linked both ways


class BlockRuns:
    def __init__(self) -> None:
        self._buckets: dict[int, dict[int, _Node]] = {}  # class -> group id -> node, LRU first
        self._nodes: dict[int, _Node] = {}
        self._counts: dict[int, int] = {}  # class -> blocks
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __contains__(self, b: Block) -> bool:
        return b.run is not None

    def class_of(self, b: Block) -> int:
        return b.run.node.cls

    def node_class(self, gid: int) -> int | None:
        node = self._nodes.get(gid)
        return None if node is None else node.cls

    def count_below(self, cls: int) -> int:
        """Blocks of classes below `cls` (O(classes))."""
        return sum(n for c, n in self._counts.items() if c < cls)

    # ---- filing ----------------------------------------------------------------------------
    def _use_node(self, gid: int, cls: int, group: Group | None) -> _Node:
        """Node `gid` at the back of its class (a new one gets class `cls` and is linked to
        `group`: `group.node` is it until it empties)."""
        node = self._nodes.get(gid)
        if node is None:
            node = self._nodes[gid] = _Node(gid, cls, group)
            if group is not None:
                group.node = node
            bucket = self._buckets.get(cls)
            if bucket is None:
                bucket = self._buckets[cls] = {}
        else:
            assert node.group is group, "a node's blocks are filed under two groups"
            bucket = self._buckets[node.cls]
            del bucket[gid]
        bucket[gid] = node
        return node

    def add_run(self, blocks: list[Block], gid: int, cls: int, group: Group | None = None) -> None:
        """File `blocks` (distinct, none filed) in order at the back of node `gid`, the node at
        the back of its class (a node that exists keeps its class: only `move_node` moves it).
        `group`: the ranking's group `gid` (every filing under an id hands the same one, or
        none). The run takes ownership of the list."""
        node = self._use_node(gid, cls, group)
        run = _Run(node, blocks)
        for b in blocks:
            assert b.run is None, "a block is filed twice"
            b.run = run
        node.runs[run] = None
        n = len(blocks)
        node.count += n
        self._counts[node.cls] = self._counts.get(node.cls, 0) + n
        self._len += n

    def add(self, b: Block, gid: int, cls: int, front: bool = False,
            group: Group | None = None) -> None:
        """File one block at the back of node `gid` (`front`: at its head, reclaimed first)."""
        if not front:
            self.add_run([b], gid, cls, group)
            return
        assert b.run is None, "a block is filed twice"
        node = self._use_node(gid, cls, group)
        first = next(iter(node.runs), None)
        if first is not None and first.front and first.clean:
            first.blocks.append(b)
            first.live += 1
            b.run = first
        else:
            run = _Run(node, [b], front=True)
            b.run = run
            node.runs = {run: None, **node.runs}  # O(runs of the node): a few
        node.count += 1
        self._counts[node.cls] = self._counts.get(node.cls, 0) + 1
        self._len += 1

    # ---- taking out --------------------------------------------------------------------------
    def remove(self, b: Block) -> None:
        run = b.run
        b.run = None
        self._left(run, 1)

    def remove_many(self, blocks: list[Block]) -> None:
        """`remove` of each (filed, distinct) block; consecutive blocks of one run are counted
        down as one."""
        last = None
        k = 0
        for b in blocks:
            run = b.run
            b.run = None
            if run is last:
                k += 1
                continue
            if last is not None:
                self._left(last, k)
            last, k = run, 1
        if last is not None:
            self._left(last, k)

    def _left(self, run: _Run, k: int) -> None:
        """`k` blocks left `run`: counts down; drops the run when empty, the node when empty."""
        node = run.node
        run.clean = False
        run.live -= k
        node.count -= k
        self._counts[node.cls] -= k
        self._len -= k
        if not run.live:
            del node.runs[run]
            if not node.runs:
                del self._buckets[node.cls][node.gid]
                del self._nodes[node.gid]
                if node.group is not None:
                    node.group.node = None

    # ---- order -----------------------------------------------------------------------------
    def move_node(self, gid: int, cls: int, again: bool = False, group: Group | None = None) -> bool:
        """A group changed class: its node (if any) goes to the back of `cls`. O(1). `again`:
        also when it is in `cls` already (it left and came back). `group` (the ranking's group
        `gid`, handed on every filing under `gid`): its `node` is ours, exactly (no lookup)."""
        node = group.node if group is not None else self._nodes.get(gid)
        if node is None:
            return False
        old = node.cls
        bucket = self._buckets[old]
        if old == cls:  # back in its class (a request's end): to its back, one bucket read
            if not again:
                return False
            del bucket[gid]
            bucket[gid] = node
            return True
        del bucket[gid]
        bucket = self._buckets.get(cls)
        if bucket is None:
            bucket = self._buckets[cls] = {}
        bucket[gid] = node
        node.cls = cls
        self._counts[old] -= node.count
        self._counts[cls] = self._counts.get(cls, 0) + node.count
        return True

    def victims(self) -> Iterator[Block]:
        """Blocks in victim order: lowest class, front node, front run, front block (lazy; the
        caller changes nothing while it reads)."""
        for cls in sorted(self._buckets):
            for node in self._buckets[cls].values():
                for run in node.runs:
                    yield from run.blocks_in()

    def first(self, n: int) -> list[Block]:
        """The first `n` blocks of `victims()` (fewer if fewer are filed), as a list: an
        allocation's victims without a generator frame per level and block."""
        out: list[Block] = []
        for cls in sorted(self._buckets):
            for node in self._buckets[cls].values():
                for run in node.runs:
                    out.extend(islice(run.blocks_in(), n - len(out)))
                    if len(out) >= n:
                        return out
        return out

    def items(self) -> Iterator[tuple[Block, int, int]]:
        """(block, node, class) of every filed block, in victim order."""
        for cls in sorted(self._buckets):
            for gid, node in self._buckets[cls].items():
                for run in node.runs:
                    for b in run.blocks_in():
                        yield b, gid, cls

    def check_integrity(self, groups: Iterable[Group] | None = None) -> None:
        """Also, given `groups` (all of the ranking's): each group's `node` is exactly its node
        here (None: no blocks of it are filed), and each node is linked to the group of its id
        (None: no group has that id, e.g. the unheld blocks' node)."""
        if groups is not None:
            by_gid = {}
            for g in groups:
                by_gid[g.gid] = g
                assert g.node is self._nodes.get(g.gid), \
                    f"group {g.gid}'s node is not its node here (or it has none here)"
            for gid, node in self._nodes.items():
                assert node.group is by_gid.get(gid), f"node {gid} is linked to another group"
        seen: set[int] = set()
        counts: dict[int, int] = {}
        num_nodes = 0
        for cls, bucket in self._buckets.items():
            for gid, node in bucket.items():
                num_nodes += 1
                assert node.gid == gid and node.cls == cls, "node filed under another key"
                assert self._nodes.get(gid) is node, "node map out of sync"
                assert node.runs, f"an empty node is left in class {cls}"
                total = 0
                for run in node.runs:
                    assert run.node is node, "a run points at another node"
                    assert not run.clean or (run.start == 0 and len(run.blocks) == run.live), \
                        "a clean run has stale entries"
                    valid = [b for b in run.blocks if b.run is run]
                    assert len(valid) == run.live > 0, "a run's live count is off (or it is dead)"
                    assert all(b.run is not run for b in run.blocks[:run.start]), \
                        "a trimmed entry is still valid"
                    for b in valid:
                        assert id(b) not in seen, "a block is filed twice"
                        seen.add(id(b))
                    total += run.live
                assert total == node.count, "a node's block count is off"
                counts[cls] = counts.get(cls, 0) + total
        assert num_nodes == len(self._nodes), "a node is in two buckets (or none)"
        assert len(seen) == self._len, "the block count is off"
        assert {c: n for c, n in counts.items() if n} == \
            {c: n for c, n in self._counts.items() if n}, "per-class counts out of sync"
