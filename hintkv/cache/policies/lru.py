"""`lru`: the baseline every engine ships: least recently used first, blind to sessions.

One class: every cached block sits in one bucket in the order it became reclaimable.
"""

from __future__ import annotations

from hintkv.cache.policies.base import EvictionPolicy, register_policy


@register_policy("lru")
class LRUPolicy(EvictionPolicy):
    name = "lru"
    num_classes = 1
    protected_class = 1  # nothing is protected
    uses_sessions = False
