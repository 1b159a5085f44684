"""`qlru`: LRU that protects the blocks of queued requests (engine-only knowledge, no hints).

What an engine knows without any hint: the prompts waiting in its queue. Blocks a queued
request's prompt will match are reclaimed after every other cached block (LRU inside both
classes). It is the baseline that separates what the queue gives from what hints give: a
session-aware policy has to beat it with what agents say.

How the engine tells it: with hints off there are no agent sessions, so the engine registers one
transient session per queued request that holds the hashes of its prompt, and ends it when the
request is admitted (`hintkv.replay.offline` and the engine's `Scheduler` do, with hints off). The policy
puts every live session's blocks in class 1, so what it protects is exactly the queued prompts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hintkv.cache.policies.base import UNHELD, EvictionPolicy, register_policy
from hintkv.cache.sessions import SessionState

if TYPE_CHECKING:
    from hintkv.cache.sessions import Session

QUEUED = 1


@register_policy("qlru")
class QueueLRUPolicy(EvictionPolicy):
    name = "qlru"
    num_classes = 2
    protected_class = QUEUED  # a prefetch never takes a queued prompt's room
    uses_sessions = True
    wants_queue = True  # the engine registers each queued request's prompt as a transient session

    def session_class(self, s: Session, now: float) -> int:
        return UNHELD if s.state is SessionState.ENDED else QUEUED
