"""The eviction classes of blocks, as the engine last published them: all a tier thread reads.

The cache layer ranks sessions and their blocks on the engine thread (`cache.ranking`). Once per
engine step it publishes what changed (`publish(delta)`: key -> class, None = no live session
holds the block any more); the board applies it under its own lock and tells each subscribed
tier, which moves its entries between class buckets. Tier and mover threads read only this board
(`rank`, `held`) and never the session registry, so nothing they read changes mid-step.

`held(key)` is the stack's "worth a write to a slower tier" test; `rank(key)` orders victims
(lowest class first, least recently used inside a class). A key the board does not know is
unheld, class 0.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

Delta = Mapping[bytes, "int | None"]


class RankBoard:
    def __init__(self, initial: Mapping[bytes, int] | None = None) -> None:
        self._lock = threading.Lock()
        self._cls: dict[bytes, int] = dict(initial or {})
        self._subscribers: list[Callable[[Delta], None]] = []
        self.num_published = 0  # publications applied (one per engine step with changes)

    def subscribe(self, fn: Callable[[Delta], None]) -> None:
        """`fn(delta)` runs after each publication, outside the board's lock."""
        self._subscribers.append(fn)

    def publish(self, delta: Delta) -> None:
        if not delta:
            return
        with self._lock:
            for key, cls in delta.items():
                if cls is None:
                    self._cls.pop(key, None)
                else:
                    self._cls[key] = cls
            self.num_published += 1
        for fn in self._subscribers:
            fn(delta)

    def rank(self, key: bytes) -> int:
        with self._lock:
            return self._cls.get(key, 0)

    def held(self, key: bytes) -> bool:
        with self._lock:
            return key in self._cls

    def __len__(self) -> int:
        with self._lock:
            return len(self._cls)
