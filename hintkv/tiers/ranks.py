"""The eviction classes of blocks, as the engine last published them: all a tier thread reads.

The cache layer ranks sessions and groups their blocks on the engine thread (`cache.ranking`):
a group is every block held by the same set of live sessions, and a block's class is its
group's. Once per engine step it publishes what changed as a `RankDelta`: blocks that entered
another group (key -> group, None = no live session holds it any more) and groups whose class
changed (group -> class, None = the group is gone). The board applies it under its own lock and
tells each subscribed tier, which moves one node per changed group (and one entry per regrouped
block) between its class buckets: a session changing state costs the tiers O(1), not O(blocks).
Tier and mover threads read only this board (`rank`, `held`, `group`) and never the session
registry, so nothing they read changes mid-step.

`held(key)` is the stack's "worth a write to a slower tier" test; `rank(key)` orders victims
(lowest class first); `group(key)` is the node a tier keeps the entry in (LRU group first, least
recently used entry first inside it; with `grouped` False, one node per class: plain LRU). A key
the board does not know is unheld, class 0. A plain mapping `{key: class}` may be published too
(each key its own group), as tests and simple callers do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

UNHELD_GROUP = 0  # the group of blocks nobody holds


@dataclass(frozen=True, slots=True)
class RankDelta:
    blocks: Mapping[bytes, Hashable | None] = field(default_factory=dict)  # key -> group
    groups: Mapping[Hashable, int | None] = field(default_factory=dict)  # group -> class

    def __bool__(self) -> bool:
        return bool(self.blocks or self.groups)

    @staticmethod
    def of(delta: RankDelta | Mapping[bytes, int | None]) -> RankDelta:
        """A delta as given, or a plain key -> class mapping with each key its own group."""
        if isinstance(delta, RankDelta):
            return delta
        return RankDelta({k: (None if c is None else k) for k, c in delta.items()},
                         {k: c for k, c in delta.items()})


Delta = RankDelta


class RankBoard:
    def __init__(self, initial: RankDelta | Mapping[bytes, int] | None = None,
                 grouped: bool = True) -> None:
        self._lock = threading.Lock()
        self._group: dict[bytes, Hashable] = {}
        self._cls: dict[Hashable, int] = {}
        self.grouped = grouped  # False: tiers keep one node per class (plain LRU inside it)
        self._subscribers: list[Callable[[RankDelta], None]] = []
        self.num_published = 0  # publications applied (one per engine step with changes)
        if initial:
            self._apply(RankDelta.of(initial))

    def subscribe(self, fn: Callable[[RankDelta], None]) -> None:
        """`fn(delta)` runs after each publication, outside the board's lock."""
        self._subscribers.append(fn)

    def publish(self, delta: RankDelta | Mapping[bytes, int | None]) -> None:
        if not delta:
            return
        delta = RankDelta.of(delta)
        with self._lock:
            self._apply(delta)
            self.num_published += 1
        for fn in self._subscribers:
            fn(delta)

    def _apply(self, delta: RankDelta) -> None:
        for key, g in delta.blocks.items():
            if g is None:
                self._group.pop(key, None)
            else:
                self._group[key] = g
        for g, cls in delta.groups.items():
            if cls is None:
                self._cls.pop(g, None)
            else:
                self._cls[g] = cls

    def rank(self, key: bytes) -> int:
        with self._lock:
            g = self._group.get(key)
            return 0 if g is None else self._cls.get(g, 0)

    def place(self, key: bytes) -> tuple[Hashable, int]:
        """(node, class) a tier files `key` under: its group (one node per class when not
        grouped) and the group's class."""
        with self._lock:
            g = self._group.get(key)
            cls = 0 if g is None else self._cls.get(g, 0)
            return (g if g is not None else UNHELD_GROUP) if self.grouped else cls, cls

    def group_class(self, group: Hashable) -> int:
        with self._lock:
            return self._cls.get(group, 0)

    def held(self, key: bytes) -> bool:
        with self._lock:
            return key in self._group

    def __len__(self) -> int:
        with self._lock:
            return len(self._group)
