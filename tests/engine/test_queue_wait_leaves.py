"""The queue wait SAM learns (`SessionRegistry.on_admitted`, told by engine/room_wait.py) when a request leaves
other than by a first admission: a running sequence that outgrew the whole pool, and a preempted one readmitted
(review_sim21 finding 1, review_sim20 finding 7). Real scheduler + SAM + KV manager, no model, one step a second."""

from __future__ import annotations

import pytest

from hintkv.sim.costs import CostModel
from hintkv.sim.profile import load_profile
from hintkv.sim.tiers import sim_tiers
from tests.engine.scheduler_helpers import run_step, sam_scheduler, session_seq

STEPS = 200  # each scene ends within 30 s: a scheduler that never serves its queue fails here, not hangs


def _seq(rid: str, sid: str, first: int, max_tokens: int, length: int = 16):
    return session_seq(rid, sid, list(range(first, first + length)), max_tokens)


def _run(num_blocks: int, max_num_seqs: int, arrivals: dict, tiers: bool = False, loaded: set | None = None):
    """Step once a second until nothing is left; returns (sessions, {request id: admitted at}, finished).
    `tiers`: the simulator's host tier (hints on), so a preempted session's written-down blocks load back;
    `loaded` collects the requests seen LOADING."""
    clock, sessions, kv, sch = sam_scheduler(num_blocks, max_num_seqs)
    if tiers:
        kv.tiers = sim_tiers(kv, True, 64, clock, CostModel(load_profile("h200-llama3-8b")))
    admitted: dict[str, float] = {}
    done: dict[str, str] = {}
    t = 0.0
    while t <= max(arrivals) or sch.has_work():
        assert t < STEPS, f"work left at {t} s that no step serves: {[s.request_id for s in sch.waiting]} waiting"
        clock.run_until(t)
        for seq in arrivals.get(t, []):
            sch.add_request(seq)
        if sch.has_work():
            out, outs = run_step(sch)
            if loaded is not None:
                loaded.update(s.request_id for s in sch.loading)
            admitted.update((s.seq.request_id, t) for s in out.scheduled if s.seq.request_id not in admitted)
            done.update((o.request_id, o.finish_reason) for o in outs if o.finished)
        sch.check_integrity()
        t += 1.0
    return sessions, admitted, done


def test_a_running_sequence_that_outgrows_the_pool_tells_no_second_wait():
    """a (16 tokens, 100 out) outgrows the 6-block pool and ends "length" in WAITING status in no queue; b, of the
    same session, queued behind it since 3 s, is admitted after: the waits learned are a's (0 s) and b's OWN.
    Taking a's WAITING status for "never admitted" told a second wait at a's end (arrival to end, its run
    included) and used b's queued count, so b's wait was never learned. And b (5 blocks) fits the pool: in the
    step that refused a, a still held its blocks, so b was judged alone and finished as larger than the pool."""
    a, b = _seq("a", "s", 100, 100), _seq("b", "s", 200, 4)
    sessions, admitted, done = _run(6, 1, {0.0: [a], 3.0: [b]})
    assert done["a"] == "length" and a.num_preemptions == 0  # out of the whole pool, never preempted
    assert admitted["b"] > 4.0 and b.num_computed_tokens > 16  # admitted after a's end, and ran
    assert list(sessions.wait.recent) == [0.0, admitted["b"] - 3.0]  # (a's arrival to its end: 9 s)


@pytest.mark.parametrize("tiers", [False, True])
def test_a_preempted_and_readmitted_request_adds_no_wait(tiers):
    """p and q (other sessions) start together in a 10-block pool; their decodes outgrow it, q is preempted and
    readmitted when p ends; q2, of q's session, queues from 1 s and is admitted after q. The waits learned: p's
    and q's (0 s) and q2's own; q's readmission tells none (told as a new wait, it took q2's queued count). With a
    host tier q's held blocks were written down and it is readmitted LOADING: that path's "first admission" flag
    (review_sim22 finding 1: `first = True` there gives [0, 0, 20])."""
    p, q, q2 = _seq("p", "sp", 100, 20), _seq("q", "sq", 200, 20), _seq("q2", "sq", 300, 4)
    loaded: set[str] = set()
    sessions, admitted, done = _run(10, 2, {0.0: [p, q], 1.0: [q2]}, tiers, loaded)
    assert q.num_preemptions == (2 if tiers else 1) and len(done) == 3  # exact per mode (was >= 1)
    assert ("q" in loaded) == tiers  # the readmission's path: LOADING with the host tier, RUNNING without
    assert list(sessions.wait.recent) == [0.0, 0.0, admitted["q2"] - 1.0]


def test_a_queued_prompt_larger_than_the_pool_is_refused_alone_and_tells_its_own_wait():
    """big (30 tokens: 8 blocks, one chunk of the 64-token budget) queues at 1 s behind x in a 6-block pool, and
    big2 of its session at 2 s. At x's end (4 s) big is alone, and the whole pool does not hold its chunk: refused
    ("length", never admitted) rather than left queued for good (review_sim21b finding 3: the alone check asked
    room for 1 token, which the empty pool has, so big stayed waiting, `has_work()` True: this scene spun until
    `STEPS`). Never admitted, it tells SAM its OWN wait (1 -> 4 s) as it leaves, and big2 its own at admission
    (review_sim21b finding 2: the refusal takes big out of `waiting` first, so a `seq in sch.waiting` check
    learns nothing there, and the end falls back to the session's latest arrival, big2's)."""
    x, big, big2 = _seq("x", "sx", 100, 4), _seq("big", "sb", 200, 4, length=30), _seq("big2", "sb", 300, 4)
    sessions, admitted, done = _run(6, 1, {0.0: [x], 1.0: [big], 2.0: [big2]})
    assert done == {"x": "length", "big": "length", "big2": "length"}  # big: out of the whole pool
    assert "big" not in admitted and big.num_computed_tokens == 0 and not big.admitted_once
    assert admitted["big2"] == 5.0  # the step after big's refusal
    assert list(sessions.wait.recent) == [0.0, 4.0 - 1.0, 5.0 - 2.0]  # x's, big's, big2's: each its own
