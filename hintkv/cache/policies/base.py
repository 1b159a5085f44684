"""The eviction-policy contract and its registry.

A policy ranks SESSIONS, not blocks: `session_class(session, now)` puts a session into one of
`num_classes` small-int classes; reclaiming takes the lowest class first. A block's class is the
highest class among the live sessions that hold it (`UNHELD` when nobody does). Inside a class,
blocks are reclaimed in the order they entered it: least recently released first, and a
session's tail blocks before its head (they enter tail first).

Classes change only on events (a request arrives or ends, a hint, a TTL) or when
`recheck_after(session, now)` says the session's class may change on its own (a predicted return
coming closer); `cache.ranking.ClassRanking` turns both into moves of blocks between buckets, so
victim selection never computes a per-block key.

Protection only orders victims; a policy never refuses an allocation. To add a policy, subclass
`EvictionPolicy`, register it by name, and pass tests/cache/test_policy_contract.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hintkv.cache.sessions import Session, SessionRegistry

_REGISTRY: dict[str, Callable[..., EvictionPolicy]] = {}

UNHELD = 0  # the class of blocks no live session holds: always reclaimed first


class EvictionPolicy:
    """Session -> class. Must be a pure function of the session and the clock."""

    __slots__ = ("sessions",)  # a slot: read by every class computation (one object, no dict)
    name = "base"
    num_classes = 1  # classes are 0 .. num_classes - 1; 0 is reclaimed first
    # Blocks of this class and above belong to sessions running now (or protected): a prefetch
    # never takes their room, and an offload keeps their device copies. num_classes: none are.
    protected_class = 1
    uses_sessions = False  # False: every block is class 0 (pure LRU), session changes are ignored

    def __init__(self, sessions: SessionRegistry | None = None, **_: Any) -> None:
        self.sessions = sessions

    def session_class(self, s: Session, now: float) -> int:
        """The class of blocks `s` holds (a live session; ended sessions hold nothing)."""
        return UNHELD

    def recheck_after(self, s: Session, now: float) -> float | None:
        """Seconds after which `session_class(s, ...)` may differ without any event; None: never."""
        return None


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
