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

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.policies.sam import band_class
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.types import SessionRef
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams
from hintkv.sim.clock import EventClock
from tests.engine.scheduler_helpers import BS, ROOT

# arrival second -> session: `late` every 15 s after its end, `soon` every 2 s (calls run ~19 s)
ARRIVALS = {0: "late", 25: "soon", 34: "late", 46: "soon", 67: "soon", 68: "late"}
PROMPTS = {"late": list(range(1000, 1016)), "soon": list(range(2000, 2016))}
END_S = 87  # `late`'s third call ends here, `soon`'s a second before
X_BLOCKS = 28  # X's first chunk (64 tokens: 16 blocks) needs 12 blocks one session holds


def _seq(rid: str, sid: str | None, tokens: list[int], max_tokens: int) -> Sequence:
    return Sequence(rid, tokens, len(tokens), SamplingParams(temperature=0, max_tokens=max_tokens),
                    ROOT, session=None if sid is None else SessionRef("t", sid, sid))


def _scene():
    clock = EventClock()
    sessions = SessionRegistry()
    kv = KVCacheManager(40, BS, make_policy("sam", sessions=sessions))
    sch = Scheduler(kv, 8, 64, sam=SessionAwareManager(kv, sessions, clock=clock), clock=clock)
    seqs, ends = [], {}
    for t in range(END_S + 1):  # one step a second
        clock.run_until(float(t))
        if t in ARRIVALS:
            sid = ARRIVALS[t]
            seqs.append(_seq(f"{sid}{t}", sid, PROMPTS[sid], 20))
            sch.add_request(seqs[-1])
        if sch.has_work():
            out = sch.schedule()
            sch.update_from_output(
                out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
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
