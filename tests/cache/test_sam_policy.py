"""The `sam` order: sessions ranked by predicted next use (Belady's rule from what agents say).

A real SessionRegistry and the registered policy; times are explicit, nothing is mocked.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.policies import make_policy
from hintkv.cache.policies.sam import (
    BANDS,
    DUE_WITHIN_TURNAROUND,
    FIRST_BAND,
    GONE,
    PROTECTED,
    band_class,
)
from hintkv.cache.sessions import SessionRegistry


def _setup():
    reg = SessionRegistry(protect_budget_blocks=100)
    return reg, make_policy("sam", sessions=reg)


def _cycle(reg, sid: str, t_arrive: float, t_done: float, parent: str | None = None):
    s = reg.on_arrival("t", sid, parent or sid, t_arrive)
    reg.on_done(s.key, [sid.encode()], t_done)
    return s


def test_just_finished_session_ranks_below_one_nearer_its_turn():
    """On a cycle the session that just finished is the farthest from its next turn: MRU, as
    Belady does, where LRU (and sam-v1's single top class) would evict the one due next."""
    reg, pol = _setup()
    for k in range(3):  # both sessions learn a 0.5 s gap; requests take 1 s (turnaround)
        _cycle(reg, "a", 1.5 * k, 1.5 * k + 1.0)
        _cycle(reg, "b", 1.5 * k + 1.0, 1.5 * k + 2.0)
    a_earlier, b_now = reg.get("t", "a"), reg.get("t", "b")  # a done at 4.0, b at 5.0
    assert pol.session_class(b_now, 5.0) < pol.session_class(a_earlier, 5.0)
    assert min(pol.session_class(a_earlier, 5.0), pol.session_class(b_now, 5.0)) > FIRST_BAND


def test_queued_request_is_protected_from_prefetch_and_outranks_a_waiting_session():
    reg, pol = _setup()
    _cycle(reg, "w", 0.0, 1.0)
    waiting = _cycle(reg, "w", 6.0, 7.0)  # its tools take 5 s
    _cycle(reg, "q", 6.0, 7.0)
    queued = reg.on_arrival("t", "q", "q", 7.5)
    assert pol.session_class(queued, 7.5) >= pol.protected_class  # what qlru protects, sam protects
    assert pol.session_class(queued, 7.5) > pol.session_class(waiting, 7.5)


def test_waiting_session_climbs_as_its_turn_comes_closer():
    reg, pol = _setup()
    for k in range(3):
        _cycle(reg, "s", 10.0 * k, 10.0 * k + 1.0)  # gap 9 s, turnaround 1 s
    s = reg.get("t", "s")
    c0 = pol.session_class(s, 21.0)
    after = pol.recheck_after(s, 21.0)
    assert after is not None and after > 0
    assert pol.session_class(s, 21.0 + after + 1e-3) > c0
    assert pol.session_class(s, 29.9) >= pol.session_class(s, 21.0 + after + 1e-3)


def test_leader_waiting_on_live_subagents_ranks_below_them():
    reg, pol = _setup()
    _cycle(reg, "lead", 0.0, 1.0)
    child = _cycle(reg, "sub", 1.0, 2.0, parent="lead")
    lead = reg.get("t", "lead")
    assert pol.session_class(lead, 2.0) == FIRST_BAND < pol.session_class(child, 2.0)
    reg.end(child.key)
    assert pol.session_class(lead, 2.0) > FIRST_BAND  # its sub-agents are done: it is due back


def test_prefetch_protects_until_the_announced_call_arrives():
    reg, pol = _setup()
    s = _cycle(reg, "p", 0.0, 1.0)
    reg.suspend(s.key)
    assert pol.session_class(s, 2.0) == GONE
    reg.prefetch(s.key, 3.0)
    assert pol.session_class(s, 3.5) == PROTECTED
    reg.on_arrival("t", "p", "p", 4.0)
    reg.on_done(s.key, [b"p"], 5.0)
    assert pol.session_class(s, 5.0) < PROTECTED  # ranked by its own prediction again
    assert pol.recheck_after(s, 5.0) is not None


@settings(max_examples=300, deadline=None)
@given(r=st.one_of(st.floats(-10, 1e4, allow_nan=False), st.just(math.inf)),
       q=st.floats(1e-3, 100, allow_nan=False))
def test_band_class_counts_the_bands_a_return_is_within(r: float, q: float) -> None:
    """The early-exit band count is the plain count over every band (BANDS descend)."""
    assert band_class(r, q) == FIRST_BAND + sum(1 for t in BANDS if r <= t * q)


@settings(max_examples=200, deadline=None)
@given(t=st.floats(1.0, 2e6, allow_nan=False))
def test_a_session_that_just_arrived_is_due_within_its_turnaround(t: float) -> None:
    """At its arrival a session's predicted use is its turnaround, exactly: it ranks in the
    protected-from-prefetch class whatever the clock reads (was: (a + q) - a rounding above q
    put about half of the arrivals one class lower)."""
    reg, pol = _setup()
    _cycle(reg, "warm", 0.0, 0.3)  # a finished call: the registry has a turnaround (not a binary fraction)
    s = reg.on_arrival("t", "s", "s", t)
    assert pol.session_class(s, t) == DUE_WITHIN_TURNAROUND


@settings(max_examples=300, deadline=None)
@given(gaps=st.lists(st.floats(0.01, 500.0), max_size=5), away=st.floats(0.0, 5000.0),
       tool=st.sampled_from([None, "bash"]))
def test_a_waiting_session_ranks_in_the_band_of_its_predicted_return(gaps, away, tool) -> None:
    """`session_class` (its reads inlined: every request's end computes it) is the band of
    the registry's predicted gap plus the turnaround, or GONE past the stale bound, whatever the
    session's history (own gaps, its tool's, everyone's, none)."""
    reg, pol = _setup()
    _cycle(reg, "warm", 0.0, 0.3)
    t, s = 10.0, None
    for g in [*gaps, None]:
        s = reg.on_arrival("t", "s", "s", t, tool)
        reg.on_done(s.key, [b"s"], t + 0.5)
        t += 0.5 + (g or 0.0)
    now = s.last_done + away
    expected, stale = reg.predicted_gap(s)
    q = reg.predicted_turnaround()
    want = GONE if now - s.last_done > stale else band_class(expected + q - (now - s.last_done), q)
    assert pol.session_class(s, now) == want


def test_every_session_aware_policy_ranks_waiting_sessions_as_away() -> None:
    """`SAMPolicy.session_class` skips reading `away_states` for a waiting session: every
    subclass may widen the away states, never drop waiting."""
    from hintkv.cache.policies import policy_names
    from hintkv.cache.policies.sam import SAMPolicy
    from hintkv.cache.sessions import SessionState
    for name in policy_names():
        pol = make_policy(name, sessions=SessionRegistry())
        if isinstance(pol, SAMPolicy):
            assert SessionState.WAITING in pol.away_states, name


@settings(max_examples=300, deadline=None)
@given(gaps=st.lists(st.floats(0.01, 500.0), min_size=2, max_size=5),
       away=st.floats(0.0, 5000.0))
def test_a_waiting_sessions_recheck_is_its_next_band_crossing(gaps, away) -> None:
    """`recheck_after` of a waiting session is the soonest of: its next band crossing (the
    least r - t * q over the bands it is still beyond), MAX_RECHECK_S, the time it is presumed
    gone (a reference over every band, not the policy's first-crossing shortcut)."""
    from hintkv.cache.policies.sam import MAX_RECHECK_S
    reg, pol = _setup()
    _cycle(reg, "warm", 0.0, 0.3)
    t, s = 10.0, None
    for g in [*gaps, None]:
        s = reg.on_arrival("t", "s", "s", t)
        reg.on_done(s.key, [b"s"], t + 0.5)
        t += 0.5 + (g or 0.0)
    now = s.last_done + away
    r = pol.next_use(s, now)
    if r is None:  # presumed gone: nothing left to recheck but the clock-free bounds
        return
    q = reg.predicted_turnaround()
    times = [MAX_RECHECK_S, *(r - b * q for b in BANDS if r > b * q),
             s.last_done + reg.predicted_gap(s)[1] - now]
    assert pol.recheck_after(s, now) == min(x for x in times if x > 0)
