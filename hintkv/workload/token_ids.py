"""One int object per token id, shared by every prompt chunk that holds the id.

    shared(np.array([1000, 48999, 1000]))  # [1000, 48999, 1000]: the table's two int objects

A token in a chunk (a tuple) costs its 8-byte pointer; a fresh int object per token costs 28 bytes
more (CPython caches only -5..256), and the whole claude-code trace set for 1000 users is ~250M
distinct block tokens. Loaders draw ids through `shared`; `hintkv.sim.workload_cache` rebuilds a
stored workload's chunks through it (a pickle keeps one copy of a shared tuple, but not of an int).
"""

from __future__ import annotations

import numpy as np

_TABLE = np.array(range(1 << 16), dtype=object)  # grown on demand, never replaced entry by entry


def table(size: int) -> np.ndarray:
    """The shared int objects 0 .. size - 1 (at least): an id keeps its object as the table grows."""
    global _TABLE
    have = len(_TABLE)
    if size > have:
        grown = np.empty(size, dtype=object)
        grown[:have] = _TABLE
        grown[have:] = list(range(have, size))
        _TABLE = grown
    return _TABLE


def shared(ids: np.ndarray) -> list[int]:
    """`ids` (an array of non-negative integers) as the table's int objects."""
    return table(int(ids.max()) + 1 if len(ids) else 0)[ids].tolist()
