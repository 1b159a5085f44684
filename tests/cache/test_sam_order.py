"""`sam-order`: suspended (offloaded) sessions ordered among themselves by predicted return, all
below the sessions that are not suspended. A real SessionRegistry, explicit times, no mocks."""

from __future__ import annotations

from hintkv.cache.policies import make_policy
from hintkv.cache.policies.sam import GONE
from hintkv.cache.policies.sam_order import AFTER_CHILDREN, FIRST_SUSPENDED, SHIFT
from hintkv.cache.sessions import SessionRegistry


def _cycles(reg, sid: str, gap: float, n: int = 3, parent: str | None = None, t0: float = 0.0) -> float:
    """n calls of 1 s with `gap` between them; returns the last call's end."""
    t = t0
    for _ in range(n):
        s = reg.on_arrival("t", sid, parent or sid, t)
        reg.on_done(s.key, [sid.encode()], t + 1.0)
        t += 1.0 + gap
    return t - gap


def test_suspended_sessions_are_ordered_by_predicted_return():
    reg = SessionRegistry(protect_budget_blocks=100)
    end_fast = _cycles(reg, "fast", 4.0)  # comes back 4 s after each call
    end_slow = _cycles(reg, "slow", 40.0, t0=end_fast - 1.0 - 2 * 41.0)  # ends at the same time
    assert end_fast == end_slow
    fast, slow = reg.get("t", "fast"), reg.get("t", "slow")
    reg.suspend(fast.key)
    reg.suspend(slow.key)
    sam, order = make_policy("sam", sessions=reg), make_policy("sam-order", sessions=reg)
    now = end_fast + 0.5
    assert sam.session_class(fast, now) == sam.session_class(slow, now) == GONE  # sam cannot tell them apart
    c_fast, c_slow = order.session_class(fast, now), order.session_class(slow, now)
    assert FIRST_SUSPENDED <= c_slow < c_fast < order.protected_class  # the slow one goes first
    waiting = reg.on_arrival("t", "w", "w", now)  # any session not suspended ranks above both
    reg.on_done(waiting.key, [b"w"], now + 0.1)
    assert order.session_class(waiting, now + 0.2) > c_fast
    assert order.session_class(fast, now + 3.0) > c_fast  # its return comes closer: it moves up
    after = order.recheck_after(fast, now)
    assert after is not None and 0 < after <= 5.0
    # far beyond every gap it had: predicted away as long again, the farthest band (never "gone":
    # that stays for waiting sessions, as in sam)
    assert order.session_class(slow, now + 10_000.0) == FIRST_SUSPENDED


def test_leader_waiting_on_live_children_goes_before_other_suspended_sessions():
    reg = SessionRegistry(protect_budget_blocks=100)
    _cycles(reg, "lead", 4.0, n=2)
    _cycles(reg, "kid", 4.0, n=2, parent="lead", t0=6.0)
    other_end = _cycles(reg, "other", 4.0, n=2, t0=6.0)
    lead, kid, other = reg.get("t", "lead"), reg.get("t", "kid"), reg.get("t", "other")
    for s in (lead, kid, other):
        reg.suspend(s.key)
    order = make_policy("sam-order", sessions=reg)
    now = other_end + 0.5
    assert order.session_class(lead, now) == AFTER_CHILDREN
    assert order.session_class(kid, now) > AFTER_CHILDREN and order.session_class(other, now) > AFTER_CHILDREN
    reg.end(kid.key)  # the children ended: the leader is ranked by its own return again
    assert order.session_class(lead, now) != AFTER_CHILDREN


def test_classes_above_suspended_are_sams_shifted():
    reg = SessionRegistry(protect_budget_blocks=100)
    s = reg.on_arrival("t", "a", "a", 0.0)
    sam, order = make_policy("sam", sessions=reg), make_policy("sam-order", sessions=reg)
    assert order.session_class(s, 0.1) == sam.session_class(s, 0.1) + SHIFT
    assert order.num_classes == sam.num_classes + SHIFT
    assert order.protected_class == sam.protected_class + SHIFT
