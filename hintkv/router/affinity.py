"""Where a session's requests go: session affinity, sub-agents next to their parent's prefix.

    choose(session, parent):
      1. the session was placed before and its instance is up      -> there (its KV is there)
      2. new session whose parent's instance is up and has room     -> the parent's instance
         (the sub-agent's prompt starts with the parent's context: a prefix hit)
      3. otherwise                                                  -> the least-loaded instance
         (in-flight requests, then sessions placed); the session is (re)placed there and
         loads its prefix from the shared pool

Sessions are keyed by (tenant, session id), the tenant being the caller's API key and cache_salt,
as the instances key them. The table is bounded (least recently used entries are forgotten:
they are then placed as new sessions).
"""

from __future__ import annotations

from collections import OrderedDict

from hintkv.router.backends import Backend, Backends

MAX_SESSIONS = 100_000


class Placement:
    def __init__(self, backends: Backends, max_inflight: int = 8,
                 max_sessions: int = MAX_SESSIONS) -> None:
        self.backends = backends
        self.max_inflight = max_inflight  # "room": a parent's instance with fewer in flight
        self.max_sessions = max_sessions
        self._where: OrderedDict[str, str] = OrderedDict()  # session key -> backend url
        self.num_affinity = 0  # requests sent where their session already was
        self.num_parent = 0  # new sub-agents placed next to their parent
        self.num_least_loaded = 0
        self.num_moved = 0  # sessions moved off an instance that was down

    def lookup(self, key: str) -> Backend | None:
        url = self._where.get(key)
        return self.backends[url] if url is not None else None

    def least_loaded(self, exclude: set[str] = frozenset()) -> Backend | None:
        up = [b for b in self.backends.healthy() if b.url not in exclude]
        return min(up, key=lambda b: (b.inflight, b.num_sessions), default=None)

    def choose(self, key: str | None, parent_key: str | None,
               exclude: set[str] = frozenset()) -> Backend | None:
        """The backend for a request of session `key` (None: no session); None if all are down."""
        if key is None:
            return self.least_loaded(exclude)
        mine = self.lookup(key)
        if mine is not None and mine.up and mine.url not in exclude:
            self.num_affinity += 1
            self._where.move_to_end(key)
            return mine
        parent = self.lookup(parent_key) if parent_key and parent_key != key else None
        if (mine is None and parent is not None and parent.up and parent.url not in exclude
                and parent.inflight < self.max_inflight):
            self.num_parent += 1
            self.place(key, parent)
            return parent
        chosen = self.least_loaded(exclude)
        if chosen is not None:
            if mine is not None:
                self.num_moved += 1
            self.num_least_loaded += 1
            self.place(key, chosen)
        return chosen

    def place(self, key: str, b: Backend) -> None:
        old = self._where.pop(key, None)
        if old is not None:
            self.backends[old].num_sessions -= 1
        self._where[key] = b.url
        b.num_sessions += 1
        while len(self._where) > self.max_sessions:
            _, url = self._where.popitem(last=False)
            self.backends[url].num_sessions -= 1

    def forget(self, key: str) -> None:
        url = self._where.pop(key, None)
        if url is not None:
            self.backends[url].num_sessions -= 1

    def check_integrity(self) -> None:
        counts: dict[str, int] = {}
        for url in self._where.values():
            counts[url] = counts.get(url, 0) + 1
        for b in self.backends.backends.values():
            assert b.num_sessions == counts.get(b.url, 0), f"{b.url}: session count out of sync"
        assert len(self._where) <= self.max_sessions
