"""`sam-fine`: `sam`'s bands cut finer, so waiting sessions of one octave go farthest return first.

A real SessionRegistry and the registered policies; times are explicit, nothing is mocked.
"""

from __future__ import annotations

from hintkv.cache.policies import make_policy
from hintkv.cache.policies.sam import GONE, PROTECTED
from hintkv.cache.policies.sam_fine import (
    FINE_BANDS,
    FINE_DUE_WITHIN_TURNAROUND,
    FINE_PROTECTED,
    fine_band_class,
)
from hintkv.cache.sessions import SessionRegistry


def _cycle(reg, sid: str, t_arrive: float, t_done: float):
    s = reg.on_arrival("t", sid, sid, t_arrive)
    reg.on_done(s.key, [sid.encode()], t_done)
    return s


def _swarm():
    """Two agents on 1 s calls with 0.3 s tools (shorter than the turnaround): `a` ended at
    4.9, `b` at 5.1, so `a` is due back 0.2 s before `b`."""
    reg = SessionRegistry(protect_budget_blocks=100)
    for k in range(4):
        _cycle(reg, "a", 1.3 * k, 1.3 * k + 1.0)
        _cycle(reg, "b", 1.3 * k + 0.2, 1.3 * k + 1.2)
    return reg, reg.get("t", "a"), reg.get("t", "b")


def test_the_session_due_back_later_goes_first_where_sam_ties_them():
    reg, a, b = _swarm()
    assert a.last_done < b.last_done
    sam, fine = make_policy("sam", sessions=reg), make_policy("sam-fine", sessions=reg)
    now = b.last_done
    # both in sam's band (Q, 2Q]: sam reclaims them in the order they entered it (a, due first, first)
    assert sam.session_class(a, now) == sam.session_class(b, now)
    assert fine.session_class(b, now) < fine.session_class(a, now)  # b, due later, goes first
    assert fine.session_class(b, now) > GONE


def test_classes_keep_sams_meaning_at_its_edges():
    reg, a, b = _swarm()
    sam, fine = make_policy("sam", sessions=reg), make_policy("sam-fine", sessions=reg)
    assert fine.num_classes == FINE_PROTECTED + 1 and fine.protected_class == FINE_DUE_WITHIN_TURNAROUND
    q = reg.predicted_turnaround()
    arriving = reg.on_arrival("t", "c", "c", 10.0)
    assert fine.session_class(arriving, 10.0) == fine.protected_class  # a queued request: r = Q
    assert fine.session_class(arriving, 10.0 + 0.5 * q) > fine.protected_class  # its wait grows
    # every r sam puts at or above its protected class (r <= Q) is at or above ours, and below not
    for r in [x * q for x in (0.01, 0.3, 0.99, 1.0, 1.01, 1.5, 3.0, 40.0)]:
        assert (fine_band_class(r, q) >= FINE_DUE_WITHIN_TURNAROUND) == (r <= q)
    reg.prefetch(a.key, 6.0)  # announced: the top class, as in sam
    assert sam.session_class(a, 6.0) == PROTECTED and fine.session_class(a, 6.0) == FINE_PROTECTED
    # away far beyond its usual gap: presumed gone, as in sam
    assert fine.session_class(b, b.last_done + 1000.0) == sam.session_class(b, b.last_done + 1000.0) == GONE


def test_the_order_is_sams_order_refined():
    """Never against sam: a session sam ranks strictly lower, sam-fine ranks lower too."""
    reg, a, b = _swarm()
    sam, fine = make_policy("sam", sessions=reg), make_policy("sam-fine", sessions=reg)
    sessions = [a, b, reg.on_arrival("t", "c", "c", 5.5)]
    for now in (5.5, 5.6, 5.9, 6.3, 7.0, 9.0):
        for x in sessions:
            for y in sessions:
                if sam.session_class(x, now) < sam.session_class(y, now):
                    assert fine.session_class(x, now) < fine.session_class(y, now)


def test_recheck_comes_at_the_next_fine_crossing():
    reg, a, b = _swarm()
    sam, fine = make_policy("sam", sessions=reg), make_policy("sam-fine", sessions=reg)
    now = b.last_done
    after = fine.recheck_after(b, now)
    assert 0 < after <= sam.recheck_after(b, now)
    before, later = fine.session_class(b, now), fine.session_class(b, now + after + 1e-9)
    assert later == before + 1  # one band up at the crossing, not before it
    assert fine.session_class(b, now + after * 0.5) == before
    assert len(FINE_BANDS) > 8 and list(FINE_BANDS) == sorted(FINE_BANDS, reverse=True)
