"""Bounded session state: ended sessions forgotten after a grace, idle ones after expiry, caps
per tenant and in total (oldest idle first), never a session with a request in flight."""

from __future__ import annotations

import tracemalloc

import pytest

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.session_bounds import SessionBounds, SessionJanitor
from hintkv.cache.sessions import SessionRegistry, session_key

BS = 4
ROOT = namespace_root("test", "float32", BS, None)


def _setup(**bounds) -> tuple[SessionRegistry, SessionJanitor]:
    reg = SessionRegistry(protect_budget_blocks=8)
    kv = KVCacheManager(32, BS, make_policy("sam", sessions=reg))
    return reg, SessionJanitor(SessionAwareManager(kv, reg), SessionBounds(**bounds))


def _request(reg: SessionRegistry, tenant: str, sid: str, at: float, parent: str | None = None,
             tokens: int = 8) -> None:
    reg.on_arrival(tenant, sid, parent or sid, now=at)
    blocks = hash_blocks(ROOT, [hash((tenant, sid)) % 1000 + i for i in range(tokens)], BS)
    reg.on_done(session_key(tenant, sid), blocks, now=at)


def test_ended_sessions_are_forgotten_after_the_grace():
    reg, jan = _setup(ended_grace_s=10)
    _request(reg, "t", "a", at=0)
    reg.end(session_key("t", "a"))
    assert jan.sweep(now=1) == 0 and reg.get("t", "a") is not None  # first seen ended at 1
    assert jan.sweep(now=10) == 0
    assert jan.sweep(now=11) == 1 and reg.get("t", "a") is None
    reg.check_integrity()
    jan.check_integrity()


def test_idle_sessions_expire_but_not_one_in_flight_or_protected():
    reg, jan = _setup(idle_expiry_s=100)
    _request(reg, "t", "idle", at=0)
    _request(reg, "t", "busy", at=0)
    reg.on_arrival("t", "busy", "busy", now=1)  # a request in flight
    _request(reg, "t", "kept", at=0)
    assert reg.set_ttl(session_key("t", "kept"), 500, now=0)
    assert jan.sweep(now=200) == 1
    assert reg.get("t", "idle") is None
    assert reg.get("t", "busy") is not None and reg.get("t", "kept") is not None
    assert not reg.holders.keys() & set(hash_blocks(ROOT, [hash(("t", "idle")) % 1000 + i
                                                          for i in range(8)], BS))
    reg.check_integrity()


def test_caps_forget_the_oldest_idle_leaves_first():
    reg, jan = _setup(max_sessions=5, max_sessions_per_tenant=3)
    for i in range(4):
        _request(reg, "a", f"s{i}", at=i)
    _request(reg, "b", "root", at=0)
    _request(reg, "b", "child", at=1, parent="root")
    reg.on_arrival("a", "s0", "s0", now=10)  # the oldest, but in flight: never forgotten
    jan.sweep(now=20)
    assert reg.get("a", "s0") is not None
    assert reg.get("a", "s1") is None  # oldest idle of tenant a
    assert sum(1 for s in reg.sessions.values() if s.tenant == "a") == 3
    assert reg.get("b", "root") is not None  # a parent with a remembered child stays
    assert len(reg.sessions) <= 5
    reg.check_integrity()


def test_a_forgotten_session_comes_back_fresh():
    reg, jan = _setup(idle_expiry_s=1)
    _request(reg, "t", "a", at=0)
    jan.sweep(now=5)
    _request(reg, "t", "a", at=6)
    assert reg.get("t", "a").num_requests == 1
    reg.check_integrity()


@pytest.mark.parametrize("bad", [{"idle_expiry_s": 0}, {"max_sessions": 0}])
def test_bounds_are_validated(bad):
    with pytest.raises(ValueError):
        SessionBounds(**bad)


def test_memory_per_idle_session_is_small():
    """Measured, not timed: what one idle session (8-block context) costs in the registry."""
    reg, _ = _setup()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(2000):
        _request(reg, "tenant", f"session-{i}", at=float(i), tokens=32)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    per_session = sum(s.size_diff for s in after.compare_to(before, "filename")) / 2000
    print(f"memory per idle session: {per_session:.0f} bytes")
    assert per_session < 8 * 1024


def test_the_protection_budget_counts_live_protections_only():
    """set_ttl sums over the sessions protected now (not over every session): the same answers
    as summing over all of them, as protections expire and sessions are forgotten."""
    import random

    reg, jan = _setup(idle_expiry_s=50)
    rng = random.Random(3)
    now = 0.0
    for step in range(400):
        now += rng.choice([0.0, 0.5, 3.0])
        sid = f"s{rng.randrange(30)}"
        if rng.random() < 0.4:
            _request(reg, "t", sid, at=now, tokens=4 * rng.randrange(1, 4))
        elif reg.get("t", sid) is not None:
            s = reg.get("t", sid)
            others = sum(len(o.held) for o in reg.sessions.values()
                         if o is not s and o.protect_until > now)
            fits = others + len(s.held) <= reg.protect_budget_blocks
            assert reg.set_ttl(s.key, rng.choice([1.0, 5.0, 20.0]), now) == fits, step
        if step % 50 == 49:
            jan.sweep(now=now)
    reg.check_integrity()
