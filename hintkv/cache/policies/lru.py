"""`lru`: the baseline every engine ships: least recently used first, blind to sessions."""

from __future__ import annotations

from typing import Any

from hintkv.cache.policies.base import EvictionPolicy, register_policy


@register_policy("lru")
class LRUPolicy(EvictionPolicy):
    name = "lru"
    lru_order = True

    def __init__(self, **_: Any) -> None:
        pass

    def key(self, block: Any) -> tuple:
        return (block.last_access,)
