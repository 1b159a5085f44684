"""Victim order by class, then group, then recency: the structure the host and disk indexes use
(the device pool keeps the same order in runs of blocks: `cache.block_runs.BlockRuns`).

    bucket per class (lowest reclaimed first)
      └─ node per group (cache.ranking: blocks the same sessions hold), least recently used first
           └─ items in the order they were filed (a session's tail before its head)

Every operation is O(1) except `victims`, which is O(what it returns + classes): filing an item
appends it to its node and moves the node to the back of its class (a use); a group changing
class moves its node whole (`move_node`); nothing ever scans or computes a per-item key.
Not thread-safe: the owner's lock guards it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from itertools import repeat
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ClassedLRU(Generic[K, V]):
    def __init__(self) -> None:
        self._buckets: dict[int, dict[Hashable, OrderedDict[K, V]]] = {}
        self._node_cls: dict[Hashable, int] = {}
        self._node_of: dict[K, Hashable] = {}
        self._counts: dict[int, int] = {}  # class -> items

    def __len__(self) -> int:
        return len(self._node_of)

    def __contains__(self, key: K) -> bool:
        return key in self._node_of

    def node_of(self, key: K) -> Hashable:
        return self._node_of[key]

    def class_of(self, key: K) -> int:
        return self._node_cls[self._node_of[key]]

    def node_class(self, node: Hashable) -> int | None:
        return self._node_cls.get(node)

    def count_below(self, cls: int) -> int:
        """Items of classes below `cls` (O(classes))."""
        return sum(n for c, n in self._counts.items() if c < cls)

    def add(self, key: K, value: V, node: Hashable, cls: int, front: bool = False) -> None:
        """File `key` at the back of `node` (`front`: at its front, reclaimed first), the node
        at the back of its class. A node that exists keeps its class (only `move_node` moves
        it to another)."""
        assert key not in self._node_of, "an item is filed twice"
        have, items = self._take_node(node, cls)
        items[key] = value
        if front:
            items.move_to_end(key, last=False)
        self._buckets.setdefault(have, {})[node] = items
        self._node_of[key] = node
        self._counts[have] = self._counts.get(have, 0) + 1

    def _take_node(self, node: Hashable, cls: int) -> tuple[int, OrderedDict[K, V]]:
        """(class, items) of `node`, taken out of its bucket to be filed again at its back; a
        new node gets class `cls` and no items."""
        have = self._node_cls.get(node)
        if have is None:
            self._node_cls[node] = cls
            return cls, OrderedDict()
        return have, self._buckets[have].pop(node)

    def remove(self, key: K) -> V:
        node = self._node_of.pop(key)
        cls = self._node_cls[node]
        items = self._buckets[cls][node]
        value = items.pop(key)
        if not items:
            del self._buckets[cls][node]
            del self._node_cls[node]
        self._counts[cls] -= 1
        return value

    def remove_many(self, keys: list[K]) -> None:
        """`remove` of each key, in one call (a sequence re-referencing its cached prefix): a
        run of keys that is a whole node (a session's context, a shared prompt) drops the node
        at once; the lookups and deletions run in C."""
        node_of, node_cls, buckets, counts = self._node_of, self._node_cls, self._buckets, self._counts
        nodes = list(map(node_of.pop, keys))
        start = 0
        while start < len(keys):
            node = nodes[start]
            end = start + 1
            while end < len(keys) and nodes[end] == node:
                end += 1
            cls = node_cls[node]
            bucket = buckets[cls]
            items = bucket[node]
            if end - start == len(items):  # distinct keys, all of this node: all of it
                del bucket[node]
                del node_cls[node]
            else:
                for key in keys[start:end]:
                    del items[key]
                if not items:
                    del bucket[node]
                    del node_cls[node]
            counts[cls] -= end - start
            start = end

    def add_run(self, keys: list[K], values: list[V], node: Hashable, cls: int) -> None:
        """`add` of each (key, value) to the back of one node, in order, in one call: the same
        order as one `add` each (a sequence releasing its blocks, tail first). C-level, and no
        pair is kept (a finished prompt files thousands of blocks)."""
        have, items = self._take_node(node, cls)
        node_of = self._node_of
        before = len(node_of)
        items.update(zip(keys, values))
        node_of.update(zip(keys, repeat(node)))
        # every key new (keys are distinct): the map grew by all of them (O(1), not a lookup each)
        assert len(node_of) == before + len(keys), "an item is filed twice"
        self._buckets.setdefault(have, {})[node] = items
        self._counts[have] = self._counts.get(have, 0) + len(keys)

    def touch(self, key: K) -> None:
        """A use: `key` newest in its node, its node newest in its class."""
        node = self._node_of[key]
        bucket = self._buckets[self._node_cls[node]]
        items = bucket.pop(node)
        items[key] = items.pop(key)
        bucket[node] = items

    def touch_many(self, keys: list[K]) -> None:
        """`touch` of each key, in order, as one call (a load's run of blocks): the same order
        as one `touch` each; a node moves once, where its last touched key puts it."""
        node_of, node_cls, buckets = self._node_of, self._node_cls, self._buckets
        last: dict[Hashable, OrderedDict[K, V]] = {}  # node -> its items, by last touch
        prev = items = None
        for key in keys:
            node = node_of[key]
            if node is not prev:
                items = buckets[node_cls[node]][node]
                last.pop(node, None)
                last[node] = items
                prev = node
            items.move_to_end(key)
        for node, items in last.items():
            bucket = buckets[node_cls[node]]
            del bucket[node]
            bucket[node] = items

    def move_node(self, node: Hashable, cls: int, again: bool = False, group: object = None) -> bool:
        """A group changed class: its node (if any) goes to the back of `cls`. O(1). `again`:
        also when it is in `cls` already (it left and came back). (`group`: unused here.)"""
        node_cls = self._node_cls
        old = node_cls.get(node)
        if old is None:
            return False
        if old == cls:
            if again:
                bucket = self._buckets[cls]
                bucket[node] = bucket.pop(node)
            return again
        buckets = self._buckets
        items = buckets[old].pop(node)
        bucket = buckets.get(cls)
        if bucket is None:
            bucket = buckets[cls] = {}
        bucket[node] = items
        node_cls[node] = cls
        n = len(items)
        counts = self._counts
        counts[old] -= n
        counts[cls] = counts.get(cls, 0) + n
        return True

    def victims(self) -> Iterator[tuple[K, V]]:
        """Items in victim order: lowest class, front node, front item first (lazy)."""
        for cls in sorted(self._buckets):
            for items in self._buckets[cls].values():
                yield from items.items()

    def items(self) -> Iterator[tuple[K, V, Hashable, int]]:
        """(key, value, node, class) of every item, in victim order."""
        for cls in sorted(self._buckets):
            for node, items in self._buckets[cls].items():
                for k, v in items.items():
                    yield k, v, node, cls

    def check_integrity(self) -> None:
        seen: dict[K, Hashable] = {}
        counts: dict[int, int] = {}
        for cls, bucket in self._buckets.items():
            for node, items in bucket.items():
                assert items, f"an empty node is left in class {cls}"
                assert self._node_cls.get(node) == cls, "node classes out of sync"
                for k in items:
                    assert k not in seen, "an item is in two nodes"
                    seen[k] = node
                counts[cls] = counts.get(cls, 0) + len(items)
        assert len(self._node_cls) == sum(len(b) for b in self._buckets.values()), \
            "a node is in two buckets (or none)"
        assert seen == self._node_of, "item -> node map out of sync"
        assert {c: n for c, n in counts.items() if n} == \
            {c: n for c, n in self._counts.items() if n}, "per-class counts out of sync"
