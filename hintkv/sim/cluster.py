"""Many simulated instances on one event clock, placed by the REAL router placement code.

    cluster = SimCluster([SimEngine(...), ...], max_inflight=8)
    engine, backend = cluster.place(ref)          # router.affinity.Placement.choose, as the router
    ... engine.submit(...); when it finishes: cluster.finished(backend)
    cluster.manage(ref, edits)                    # the session's instance; evicts fan out

What the router does per request (`hintkv.router.app.Router.forward`), without HTTP: the session
key is (tenant, cache_salt, session id) as `Identity` builds it, `Placement.choose` picks the
instance (session affinity; a new sub-agent next to its parent if that instance has room; else the
least loaded by requests in flight, then sessions placed), the backend's `inflight` counts the
request until it finishes. A management request goes where its session is; an evict is also
applied on the other instances the session or its sub-agents were ever placed on (the router's
fan-out, `Placement.fanout_targets`: a moved session left blocks behind), and
a root session's whole-session evict forgets its placement. Every configuration is routed by
session, hints or not: the router reads the session headers the clients always send.
"""

from __future__ import annotations

import json

from hintkv.engine.types import CacheEdit, EditOutcome, SessionRef
from hintkv.router.affinity import Placement
from hintkv.router.backends import Backend, Backends
from hintkv.sim.engine import SimEngine


def session_key(tenant: str, session_id: str, salt: str = "") -> str:
    """The router's placement key (`router.app.Identity`: auth identity, cache_salt, session)."""
    return json.dumps([tenant, salt, session_id])


class SimCluster:
    def __init__(self, engines: list[SimEngine], max_inflight: int = 8) -> None:
        if not engines:
            raise ValueError("a cluster needs at least one engine")
        self.engines = engines
        urls = [f"sim://instance-{i}" for i in range(len(engines))]
        self.by_url = dict(zip(urls, engines, strict=True))
        self.index = {u: i for i, u in enumerate(urls)}
        self.placement = Placement(Backends(urls), max_inflight)
        self.num_fanout = 0

    @property
    def clock(self):
        return self.engines[0].clock

    def _keys(self, ref: SessionRef) -> tuple[str, str | None]:
        parent = ref.parent_session_id
        return (session_key(ref.tenant, ref.session_id),
                session_key(ref.tenant, parent) if parent and parent != ref.session_id else None)

    def place(self, ref: SessionRef) -> tuple[SimEngine, Backend]:
        key, parent = self._keys(ref)
        b = self.placement.choose(key, parent)
        assert b is not None, "every simulated instance is up"
        b.inflight += 1
        b.num_requests += 1
        return self.by_url[b.url], b

    def finished(self, b: Backend) -> None:
        b.inflight -= 1

    def manage(self, ref: SessionRef, edits: list[CacheEdit]) -> list[EditOutcome]:
        key, parent = self._keys(ref)
        b = self.placement.choose(key, parent)
        assert b is not None
        b.num_requests += 1
        out = self.by_url[b.url].manage(ref, edits)
        evicts = [e for e in edits if e.action == "evict"]
        if evicts:
            targets = self.placement.fanout_targets(key)  # as the router: where it may hold KV
            for url, eng in self.by_url.items():
                if url != b.url and (targets is None or url in targets):
                    eng.manage(ref, evicts)
                    self.num_fanout += 1
            whole = any(e.token_start is None for e in evicts)
            if whole and parent is None:  # a root session ended: forget where it was
                self.placement.forget(key)
        return out

    def instance_of(self, ref: SessionRef) -> SimEngine | None:
        b = self.placement.lookup(self._keys(ref)[0])
        return None if b is None else self.by_url[b.url]

    def stats(self) -> dict[str, int]:
        p = self.placement
        return {"affinity": p.num_affinity, "parent": p.num_parent,
                "least_loaded": p.num_least_loaded, "moved": p.num_moved, "fanout": self.num_fanout}

    def check_integrity(self) -> None:
        self.placement.check_integrity()
        assert all(b.inflight == 0 for b in self.placement.backends.backends.values()), (
            "a request still counted in flight")
        for eng in self.engines:
            eng.scheduler.check_integrity()
