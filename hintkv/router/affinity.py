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

An evict fans out to the other instances that may hold the session's KV (`fanout_targets`): those
the session or any of its sub-agents was ever placed on (a moved session left blocks behind; a
sub-agent placed elsewhere holds its parent's prefix there). Elsewhere the session is unknown and
the evict would change nothing. The trails are bounded as the table is: a session forgotten
there is placed as a new one and starts a new trail; a request with no session fans out to all.
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
        # session key -> (parent key, urls it or its sub-agents were placed on), bounded as _where
        self._trail: OrderedDict[str, tuple[str | None, set[str]]] = OrderedDict()
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
            self.place(key, parent, parent_key)
            return parent
        chosen = self.least_loaded(exclude)
        if chosen is not None:
            if mine is not None:
                self.num_moved += 1
            self.num_least_loaded += 1
            self.place(key, chosen, parent_key)
        return chosen

    def place(self, key: str, b: Backend, parent_key: str | None = None) -> None:
        old = self._where.pop(key, None)
        if old is not None:
            self.backends[old].num_sessions -= 1
        self._where[key] = b.url
        b.num_sessions += 1
        while len(self._where) > self.max_sessions:
            _, url = self._where.popitem(last=False)
            self.backends[url].num_sessions -= 1
        self._mark(key, parent_key if parent_key != key else None, b.url)

    def _mark(self, key: str, parent_key: str | None, url: str) -> None:
        """`url` joins the trail of `key` and of each of its known ancestors."""
        trail = self._trail.get(key)
        if trail is None:
            trail = self._trail[key] = (parent_key, set())
        self._trail.move_to_end(key)
        trail[1].add(url)
        seen = {key}
        up = trail[0]
        while up is not None and up not in seen and (t := self._trail.get(up)) is not None:
            t[1].add(url)
            seen.add(up)
            up = t[0]
        while len(self._trail) > self.max_sessions:
            self._trail.popitem(last=False)

    def fanout_targets(self, key: str | None) -> set[str] | None:
        """Instances an evict of session `key` must also reach (its trail); None: not known
        (forgotten, or no session): every instance."""
        t = self._trail.get(key) if key is not None else None
        return None if t is None else set(t[1])

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
