"""The eviction-policy contract and its registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_REGISTRY: dict[str, Callable[..., "EvictionPolicy"]] = {}


class EvictionPolicy:
    """Orders reclaimable blocks: `key(block)` smallest first. Must not mutate anything."""

    name = "base"
    lru_order = False  # True: key is last-release order, so the pool may skip computing keys

    def prepare(self) -> None:
        """Called once before a round of `key` calls (a policy may snapshot the clock here)."""

    def key(self, block: Any) -> tuple:
        raise NotImplementedError


def register_policy(name: str):
    def deco(factory: Callable[..., EvictionPolicy]):
        _REGISTRY[name] = factory
        return factory
    return deco


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def make_policy(name: str, **context: Any) -> EvictionPolicy:
    """Build the named policy; `context` carries what session-aware policies need (sessions=...)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown eviction policy {name!r}; known: {', '.join(policy_names())}")
    return _REGISTRY[name](**context)
