"""Eviction policies: a function of block (and session) state to a sortable key, chosen by name.

The smallest key is reclaimed first. A policy only orders victims; it never refuses an
allocation (soft protection: the engine can always make progress).
"""

from hintkv.cache.policies import lru as _lru  # noqa: F401  (registers "lru")
from hintkv.cache.policies import qlru as _qlru  # noqa: F401  (registers "qlru")
from hintkv.cache.policies import sam as _sam  # noqa: F401  (registers "sam")
from hintkv.cache.policies import sam_dist as _sam_dist  # noqa: F401  (registers "sam-dist")
from hintkv.cache.policies import sam_fine as _sam_fine  # noqa: F401  (registers "sam-fine")
from hintkv.cache.policies import sam_order as _sam_order  # noqa: F401  (registers "sam-order")
from hintkv.cache.policies import sam_v1 as _sam_v1  # noqa: F401  (registers "sam-v1")
from hintkv.cache.policies.base import (
    EvictionPolicy,
    make_policy,
    policy_names,
    register_policy,
)

__all__ = ["EvictionPolicy", "make_policy", "policy_names", "register_policy"]
