"""The queue wait SAM learns (`SessionRegistry.on_admitted`, told by engine/room_wait.py) when a request leaves
other than by a first admission: a running sequence that outgrew the whole pool, and a preempted one readmitted
(review_sim21 finding 1, review_sim20 finding 7). Real scheduler + SAM + KV manager, no model, one step a second."""

from __future__ import annotations

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.types import SessionRef
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams
from hintkv.sim.clock import EventClock
from tests.engine.scheduler_helpers import BS, ROOT


def _seq(rid: str, sid: str, first: int, max_tokens: int) -> Sequence:
    tokens = list(range(first, first + 16))
    return Sequence(rid, tokens, len(tokens), SamplingParams(temperature=0, max_tokens=max_tokens), ROOT,
                    session=SessionRef("t", sid, sid))


def _run(num_blocks: int, max_num_seqs: int, arrivals: dict[float, list[Sequence]]):
    """Step once a second until nothing is left; returns (sessions, {request id: admitted at}, finished)."""
    clock = EventClock()
    sessions = SessionRegistry()
    kv = KVCacheManager(num_blocks, BS, make_policy("sam", sessions=sessions))
    sch = Scheduler(kv, max_num_seqs, 64, sam=SessionAwareManager(kv, sessions, clock=clock), clock=clock)
    admitted: dict[str, float] = {}
    done: dict[str, str] = {}
    t = 0.0
    while t <= max(arrivals) or sch.has_work():
        clock.run_until(t)
        for seq in arrivals.get(t, []):
            sch.add_request(seq)
        if sch.has_work():
            out = sch.schedule()
            admitted.update((s.seq.request_id, t) for s in out.scheduled if s.seq.request_id not in admitted)
            outs = sch.update_from_output(
                out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
            done.update((o.request_id, o.finish_reason) for o in outs if o.finished)
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


def test_a_preempted_and_readmitted_request_adds_no_wait():
    """p and q (other sessions) start together in a 10-block pool; their decodes outgrow it, q is preempted and
    readmitted when p ends; q2, of q's session, queues from 1 s and is admitted after q. The waits learned: p's
    and q's (0 s) and q2's own; q's readmission tells none (told as a new wait, it took q2's queued count)."""
    p, q, q2 = _seq("p", "sp", 100, 20), _seq("q", "sq", 200, 20), _seq("q2", "sq", 300, 4)
    sessions, admitted, done = _run(10, 2, {0.0: [p, q], 1.0: [q2]})
    assert q.num_preemptions == 1 and len(done) == 3
    assert list(sessions.wait.recent) == [0.0, 0.0, admitted["q2"] - 1.0]
