"""SAM predicts a session's next use by its queue wait W (arrival -> admission, told by the
scheduler: `SessionRegistry.on_admitted`), not by the turnaround Q (arrival -> end), which stays
the bands' scale (real scheduler + SAM + KV manager, no model; issue #9).

The scene of issue #9 at 100 users: requests run long (Q = 19 s here; 92 s behind 155K-token
prefills there) but are admitted at once (W ~ 0). Session `soon` is back 2 s after each call,
`late` 15 s. `soon` ends at 86 s, `late` at 87 s, when a cold call X arrives whose first chunk
needs more room than is free. With r = gap + Q both are in the band (Q, 2Q] and X took the
prefix filed there first, `soon`'s, due back in 1 s; with r = gap + W `soon` ranks (0, Q/8] and
`late` (Q/2, Q], and X takes `late`'s.
"""

from __future__ import annotations

import pytest

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.policies.sam import band_class
from hintkv.cache.policies.sam_fine import fine_band_class
from hintkv.cache.sessions import SessionRegistry
from tests.engine.scheduler_helpers import BS, run_step, sam_scheduler
from tests.engine.scheduler_helpers import session_seq as _seq

# arrival second -> session: `late` every 15 s after its end, `soon` every 2 s (calls run ~19 s)
ARRIVALS = {0: "late", 25: "soon", 34: "late", 46: "soon", 67: "soon", 68: "late"}
PROMPTS = {"late": list(range(1000, 1016)), "soon": list(range(2000, 2016))}
END_S = 87  # `late`'s third call ends here, `soon`'s a second before
X_BLOCKS = 28  # X's first chunk (64 tokens: 16 blocks) needs 12 blocks one session holds


def _scene():
    clock, sessions, kv, sch = sam_scheduler(40, 8)
    seqs, ends = [], {}
    for t in range(END_S + 1):  # one step a second
        clock.run_until(float(t))
        if t in ARRIVALS:
            sid = ARRIVALS[t]
            seqs.append(_seq(f"{sid}{t}", sid, PROMPTS[sid], 20))
            sch.add_request(seqs[-1])
        if sch.has_work():
            run_step(sch)
        ends.update((s.request_id, t) for s in seqs if s.finish_reason and s.request_id not in ends)
    return clock, sessions, kv, sch, ends


def _resident(sessions: SessionRegistry, kv: KVCacheManager, sid: str) -> int:
    return sum(kv.pool.lookup(h) is not None for h in sessions.get("t", sid).held)


def test_a_session_due_back_soon_keeps_its_prefix_over_one_due_later_while_the_turnaround_is_long():
    clock, sessions, kv, sch, ends = _scene()
    assert ends["soon67"] == END_S - 1 and ends["late68"] == END_S  # the scene's timeline
    q, w = sessions.predicted_turnaround(), sessions.predicted_wait()
    assert q > 15.0 and w < 0.01  # long runs, no queue
    soon, late = sessions.get("t", "soon"), sessions.get("t", "late")
    assert soon.rank_cls == band_class(2.0 + w - 1.0, q) > late.rank_cls == band_class(15.0 + w, q)
    held = len(soon.held)
    assert _resident(sessions, kv, "soon") == held == _resident(sessions, kv, "late")
    x = _seq("x", None, list(range(5000, 5000 + X_BLOCKS * BS)), 1)
    sch.add_request(x)
    sch.schedule()
    assert _resident(sessions, kv, "soon") == held  # due back in 1 s: kept
    assert _resident(sessions, kv, "late") < held  # due back in 15 s: reclaimed for X
    kv.check_integrity()
    sessions.check_integrity()


# each policy's class of a session predicted back in r s (sam-dist's residual 1 s into a 2 s gap
# whose every observed gap was 2 s is 1 s: sam's mean gap less the time away)
BANDS_OF = {"sam": band_class, "sam-fine": fine_band_class, "sam-dist": band_class}


@pytest.mark.parametrize("policy", sorted(BANDS_OF))
def test_each_sam_predicts_a_waiting_session_back_by_the_queue_wait_not_the_turnaround(policy):
    """sam, sam-fine and sam-dist rank a session waiting on its tool by gap + W - away (fails
    under r = gap + Q - away in any of them: review_drain1 finding 7). Calls of 19 s admitted at
    once (Q = 19 s, W = 0: its floor), a session whose tool gaps are 2 s, 1 s into its third."""
    reg = SessionRegistry()
    for arrival in (0.0, 21.0, 42.0):  # 19 s calls, 2 s gaps
        reg.on_arrival("t", "a", "a", now=arrival)
        reg.on_admitted("t\x1fa", now=arrival, arrival=arrival)
        reg.on_done("t\x1fa", [], now=arrival + 19.0)
    s, q, w = reg.get("t", "a"), reg.predicted_turnaround(), reg.predicted_wait()
    assert q == 19.0 and w == 1e-3 and s.gap_prediction[0] == 2.0
    bands = BANDS_OF[policy]
    cls = make_policy(policy, sessions=reg).session_class(s, now=62.0)
    assert cls == bands(2.0 + w - 1.0, q) != bands(2.0 + q - 1.0, q)


def test_the_wait_is_observed_once_at_admission_and_at_the_end_where_none_was_told():
    """`on_admitted` observes a request's wait once (a preempted request's second admission is
    no new wait); a request whose admission nobody told (an engine that tells none, a queued
    request aborted) is observed at its end, as the turnaround: there W = Q."""
    reg = SessionRegistry()
    reg.on_arrival("t", "a", "a", now=0.0)
    reg.on_admitted("t\x1fa", now=2.0)
    reg.on_admitted("t\x1fa", now=5.0)  # readmitted after a preemption
    reg.on_done("t\x1fa", [], now=9.0)
    assert reg.predicted_wait() == 2.0 and reg.predicted_turnaround() == 9.0
    untold = SessionRegistry()
    untold.on_arrival("t", "b", "b", now=0.0)
    untold.on_done("t\x1fb", [], now=4.0)
    assert untold.predicted_wait() == untold.predicted_turnaround() == 4.0


def test_two_requests_of_one_session_in_flight_each_tell_their_own_wait():
    """The wait is the request's, not the session's (review_drain1 finding 4): request 1 is
    admitted at once, request 2 of the same session arrives at 1 s and waits while request 1
    ends at 1.5 s, and is admitted at 31 s. The waits are 0 s and 30 s; request 1's end neither
    observes request 2's wait nor hides its admission. A request whose admission is never told
    (aborted queued) is observed once, at the first end that leaves fewer requests in flight than
    unadmitted ones: its own when it is the last, else the later one's."""
    reg = SessionRegistry()
    key = "t\x1fa"
    reg.on_arrival("t", "a", "a", now=0.0)
    reg.on_admitted(key, now=0.0, arrival=0.0)
    reg.on_arrival("t", "a", "a", now=1.0)
    reg.on_done(key, [], now=1.5)
    assert list(reg.wait.recent) == [0.0]  # request 1's only
    reg.on_admitted(key, now=31.0, arrival=1.0)
    assert list(reg.wait.recent) == [0.0, 30.0]  # request 2's, at its admission
    reg.on_done(key, [], now=40.0)
    assert list(reg.wait.recent) == [0.0, 30.0]  # told at its admission: not again at its end
    both = SessionRegistry()  # request 2 arrives while request 1 still queues: each its own arrival
    both.on_arrival("t", "c", "c", now=0.0)
    both.on_arrival("t", "c", "c", now=2.0)
    both.on_admitted("t\x1fc", now=5.0, arrival=0.0)
    both.on_admitted("t\x1fc", now=6.0, arrival=2.0)
    assert list(both.wait.recent) == [5.0, 4.0]
    aborted = SessionRegistry()
    aborted.on_arrival("t", "b", "b", now=0.0)
    aborted.on_admitted("t\x1fb", now=0.0, arrival=0.0)
    aborted.on_arrival("t", "b", "b", now=1.0)
    aborted.on_done("t\x1fb", [], now=3.0)  # request 2 aborted queued: which one ended is not told
    assert list(aborted.wait.recent) == [0.0]
    aborted.on_done("t\x1fb", [], now=5.0)  # none left in flight: the unadmitted one's wait, once
    assert list(aborted.wait.recent) == [0.0, 4.0]  # (to the latest arrival: the session's)
    aborted.on_done("t\x1fb", [], now=6.0)  # (a stray end: nothing more)
    assert list(aborted.wait.recent) == [0.0, 4.0]


def test_the_scheduler_tells_each_request_its_own_wait_and_an_abort_in_the_queue_its_own():
    """The scheduler's side (engine/room_wait.py; review_sim20 finding 7): one session, one sequence at a time. a
    runs from 0 s; b arrives at 1 s and c at 2 s; b is admitted at a's end, c at b's: each wait is from its OWN
    arrival (the session's latest arrival gives b 1 s less). Behind a running x, d arrives and is aborted queued
    3 s later: its own wait, 3 s, is learned when it leaves (what the old code learned instead: the comment at
    the assertion)."""
    clock, sessions, _, sch = sam_scheduler(40, 1)
    admitted: dict[str, float] = {}

    def step(t: float) -> None:
        clock.run_until(t)
        if sch.has_work():
            out, _ = run_step(sch)
            admitted.update((s.seq.request_id, t) for s in out.scheduled if s.seq.request_id not in admitted)

    arrivals = {"a": 0.0, "b": 1.0, "c": 2.0}
    t = 0.0
    while t == 0.0 or sch.has_work():
        clock.run_until(t)
        for rid in [r for r, at in arrivals.items() if at == t]:
            sch.add_request(_seq(rid, "s", list(range(100 * ord(rid), 100 * ord(rid) + 16)), 4))
        step(t)
        t += 1.0
    assert admitted["b"] > arrivals["c"]  # b was admitted after c arrived: the latest arrival is not b's
    assert list(sessions.wait.recent) == [admitted[r] - at for r, at in arrivals.items()]
    t0 = t
    clock.run_until(t + 10.0)
    sch.add_request(_seq("x", "s", list(range(9000, 9016)), 50))  # runs: d queues behind it
    step(t + 10.0)
    sch.add_request(_seq("d", "s", list(range(9100, 9116)), 4))
    clock.run_until(t + 12.0)
    sch.add_request(_seq("e", "s", list(range(9200, 9216)), 4))  # the session's latest arrival now
    clock.run_until(t + 13.0)
    before = len(sessions.wait.recent)
    assert sch.abort_request("d")
    # d's own: 10 -> 13 s (without the scheduler's report nothing is learned at the abort, and x's end later falls
    # back to the session's latest arrival, e's: 49 s; with the latest arrival in the report, 1 s)
    assert list(sessions.wait.recent)[before:] == [pytest.approx(3.0)]
    t = t0 + 13.0
    while sch.has_work():  # to the end: x ends, e is admitted and tells its own wait, nothing else is learned
        step(t)
        t += 1.0
    assert list(sessions.wait.recent)[before:] == [pytest.approx(3.0), pytest.approx(admitted["e"] - (t0 + 12.0))]
