"""`sam-dist`: the gap distribution's residual, and offloaded sessions ranked by their return.

A real SessionRegistry and the registered policies; times are explicit, nothing is mocked.
"""

from __future__ import annotations

from hintkv.cache.gaps import GapEstimator
from hintkv.cache.policies import make_policy
from hintkv.cache.policies.sam import FIRST_BAND, GONE, band_class
from hintkv.cache.sessions import SessionRegistry


def _cycle(reg, sid: str, t_arrive: float, t_done: float):
    s = reg.on_arrival("t", sid, sid, t_arrive)
    reg.on_done(s.key, [sid.encode()], t_done)
    return s


def test_residual_is_the_median_remaining_wait_of_longer_gaps():
    est = GapEstimator()
    for g in (1.0, 2.0, 10.0, 100.0):
        est.observe(g)
    assert est.residual(0.0) == 6.0  # median of all four
    assert est.residual(5.0) == 50.0  # gaps longer than 5 s: 10 and 100, 5 and 95 to go
    assert est.residual(200.0) == 200.0  # beyond every observed gap: as long again


def _heavy_tail_session():
    """A session whose waits are mostly 1 s and sometimes 60 s, just done: (registry, session, t)."""
    reg = SessionRegistry(protect_budget_blocks=100)
    t = 0.0
    for g in (1.0, 1.0, 60.0, 1.0, 1.0, 60.0, 1.0, 1.0):
        _cycle(reg, "s", t, t + 0.5)
        t += 0.5 + g
    return reg, _cycle(reg, "s", t, t + 0.5), t


def test_a_long_wait_predicts_a_long_remaining_wait():
    """Heavy tail: most waits 1 s, a few 60 s. After 5 s away, `sam` (EWMA mean) still expects
    the session within seconds; `sam-dist` knows it is in a long wait (~55 s to go)."""
    reg, s, t = _heavy_tail_session()
    dist = make_policy("sam-dist", sessions=reg)
    soon, later = dist.next_use(s, t + 0.5), dist.next_use(s, t + 5.5)
    assert soon < 5.0
    assert later > 50.0


def test_a_subclass_prediction_sets_its_waiting_class():
    """`SAMPolicy.session_class` computes sam's own wait inline; a subclass's `_waiting_next_use`
    (sam-dist's) must still decide its class. The heavy-tail session above, just done: sam's EWMA
    mean expects it in ~13 s, sam-dist's residual in ~1.5 s, so they file it in different bands."""
    reg, s, t = _heavy_tail_session()
    sam, dist = make_policy("sam", sessions=reg), make_policy("sam-dist", sessions=reg)
    q = reg.predicted_turnaround()
    for now in (t + 0.5, t + 1.0, t + 2.0, t + 5.5):
        for policy in (sam, dist):  # each class is the band of that policy's own prediction
            r = policy.next_use(s, now)
            assert policy.session_class(s, now) == (GONE if r is None else band_class(r, q))
    assert dist.session_class(s, t + 0.5) > sam.session_class(s, t + 0.5)  # due sooner: a nearer band


def test_suspended_session_is_ranked_by_its_return_not_presumed_gone():
    reg = SessionRegistry(protect_budget_blocks=100)
    for k in range(3):  # gap 9 s, turnaround 1 s
        _cycle(reg, "s", 10.0 * k, 10.0 * k + 1.0)
    s = reg.get("t", "s")
    reg.suspend(s.key)
    sam, dist = make_policy("sam", sessions=reg), make_policy("sam-dist", sessions=reg)
    assert sam.session_class(s, 21.5) == GONE
    assert dist.session_class(s, 21.5) >= FIRST_BAND
    assert dist.session_class(s, 29.9) > dist.session_class(s, 21.5)  # its turn comes closer
    after = dist.recheck_after(s, 21.5)
    assert after is not None and 0 < after <= 5.0


def test_leader_waiting_on_offloaded_children_stays_farthest():
    reg = SessionRegistry(protect_budget_blocks=100)
    _cycle(reg, "lead", 0.0, 1.0)
    child = reg.on_arrival("t", "kid", "lead", 1.5)
    reg.on_done(child.key, [b"kid"], 2.0)
    reg.suspend(child.key)
    lead = reg.get("t", "lead")
    reg.suspend(lead.key)
    dist = make_policy("sam-dist", sessions=reg)
    assert dist.session_class(lead, 2.5) == FIRST_BAND
    assert dist.session_class(child, 2.5) >= FIRST_BAND
