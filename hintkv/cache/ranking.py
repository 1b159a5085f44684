"""Session classes -> block classes, kept up to date by events instead of computed per victim.

The eviction policy puts each live session into a class (`EvictionPolicy.session_class`). A
block's class is the highest class among the sessions holding it, found from per-hash counts of
holders per class, so a session changing class costs O(blocks it holds), whatever the number of
other holders of a shared prefix:

    session event (arrival, done, hint, TTL)  ─▶ session_changed(s) ─▶ counts of s.held move
    a predicted return coming closer          ─▶ tick(now): due rechecks (a heap), same path
    held list replaced (request done, evict)  ─▶ held_changed(s, removed, added)

Each block whose class changes is reported at once to `listeners` (the device pool moves it to
its new bucket) and gathered in a delta that the engine publishes to the tiers once per step
(`take_delta`: hash -> class, None = no live session holds it any more). Runs on the engine
thread, under its state lock, like the registry it follows.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from hintkv.cache.hashing import BlockHash
from hintkv.cache.policies.base import UNHELD, EvictionPolicy

if TYPE_CHECKING:
    from hintkv.cache.sessions import Session

ClassListener = Callable[[BlockHash, int], None]  # (hash, new class)


class ClassRanking:
    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.num_classes = policy.num_classes
        self._session_cls: dict[str, int] = {}  # live session key -> its class
        self._counts: dict[BlockHash, list[int]] = {}  # held hash -> holders per class
        self._top: dict[BlockHash, int] = {}  # held hash -> its class (highest non-zero count)
        self._delta: dict[BlockHash, int | None] = {}
        self._rechecks: list[tuple[float, int, str]] = []  # (due, version, session key)
        self._version: dict[str, int] = {}
        self.listeners: list[ClassListener] = []
        self.num_moves = 0  # block class changes reported
        self.clock: Callable[[], float] = time.monotonic  # for events that carry no time
        if policy.sessions is not None:
            policy.sessions.ranking = self

    # ---- queries ---------------------------------------------------------------------------
    def block_class(self, h: BlockHash | None) -> int:
        return UNHELD if h is None else self._top.get(h, UNHELD)

    def is_held(self, h: BlockHash) -> bool:
        return h in self._top

    def session_class(self, key: str) -> int | None:
        return self._session_cls.get(key)

    def snapshot(self) -> dict[BlockHash, int]:
        """Every held hash and its class (for a tier board joining late)."""
        return dict(self._top)

    def take_delta(self) -> Mapping[BlockHash, int | None]:
        """Class changes since the last call, frozen: hash -> class, None = no longer held."""
        delta, self._delta = self._delta, {}
        return MappingProxyType(delta)

    # ---- events (from SessionRegistry) -----------------------------------------------------
    def session_changed(self, s: Session, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        old = self._session_cls.get(s.key)
        new = self.policy.session_class(s, now) if self.policy.uses_sessions else UNHELD
        if old is None:
            self._session_cls[s.key] = new
        elif new != old:
            self._session_cls[s.key] = new
            for h in reversed(s.held):  # tail first: a session's tail is reclaimed before its head
                self._shift(h, old, new)
        self._schedule(s, now)

    def held_changed(self, s: Session, removed: Iterable[BlockHash],
                     added: Iterable[BlockHash]) -> None:
        c = self._session_cls.get(s.key)
        if c is None:
            c = self._session_cls[s.key] = (self.policy.session_class(s, self.clock())
                                            if self.policy.uses_sessions else UNHELD)
        for h in removed:
            self._shift(h, c, None)
        for h in added:
            self._shift(h, None, c)

    def forget(self, key: str) -> None:
        """A session that holds nothing and is gone for good."""
        self._session_cls.pop(key, None)
        self._version.pop(key, None)

    def tick(self, now: float, sessions: Mapping[str, Session]) -> int:
        """Re-rank sessions whose recheck is due (a predicted return came closer, a TTL ran
        out). Returns how many were re-ranked."""
        n = 0
        while self._rechecks and self._rechecks[0][0] <= now:
            _, version, key = heapq.heappop(self._rechecks)
            s = sessions.get(key)
            if s is None or self._version.get(key) != version:
                continue  # superseded by a later event
            self.session_changed(s, now)
            n += 1
        return n

    # ---- internals -------------------------------------------------------------------------
    def _schedule(self, s: Session, now: float) -> None:
        version = self._version.get(s.key, 0) + 1
        self._version[s.key] = version
        after = self.policy.recheck_after(s, now) if self.policy.uses_sessions else None
        if after is not None:
            heapq.heappush(self._rechecks, (now + max(after, 0.0) + 1e-3, version, s.key))

    def _shift(self, h: BlockHash, old: int | None, new: int | None) -> None:
        """One holder of `h` moves from class `old` to `new` (None: not a holder). O(1) unless
        the top class empties (then a scan of at most num_classes counts)."""
        counts = self._counts.get(h)
        before = self._top.get(h)
        if counts is None:
            if new is None:
                return
            counts = self._counts[h] = [0] * self.num_classes
        if old is not None:
            counts[old] -= 1
        if new is not None:
            counts[new] += 1
        after = before
        if new is not None and (before is None or new > before):
            after = new
        elif old is not None and old == before and not counts[old]:
            after = next((c for c in range(old - 1, -1, -1) if counts[c]), None)
            if after is None and new is None:
                del self._counts[h]
        if after == before:
            return
        if after is None:
            del self._top[h]
        else:
            self._top[h] = after
        self._delta[h] = after
        self.num_moves += 1
        for listener in self.listeners:
            listener(h, UNHELD if after is None else after)

    def check_integrity(self, sessions: Mapping[str, Session]) -> None:
        expect: dict[BlockHash, list[int]] = {}
        for s in sessions.values():
            c = self._session_cls.get(s.key)
            if s.held:
                assert c is not None, f"session {s.session_id} holds blocks but has no class"
            for h in s.held:
                expect.setdefault(h, [0] * self.num_classes)[c] += 1
        assert expect == self._counts, "class counts out of sync with the sessions' held lists"
        assert self._top == {h: max(c for c, n in enumerate(counts) if n)
                             for h, counts in expect.items()}, "a block's class is stale"
