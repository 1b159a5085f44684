"""How many queued calls a step leaves waiting for room (`SchedulerOutput.num_room_waits`, set by
`batching.admit_waiting`; the simulator charges their wait to "room"): a refused candidate that
stops admission counts itself and every one behind it, less those the policy held with room
(`AdmissionPolicy.holds`); a skipped one counts itself. The real scheduler and KV manager, no model.
"""

from __future__ import annotations

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.engine.admission import make_admission
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import SeqStatus, Sequence
from hintkv.engine.types import SamplingParams
from tests.engine.scheduler_helpers import BS, ROOT


def _seq(rid: str, start: int, num_tokens: int, max_tokens: int = 2) -> Sequence:
    tokens = list(range(start, start + num_tokens))
    return Sequence(rid, tokens, len(tokens), SamplingParams(temperature=0, max_tokens=max_tokens), ROOT)


def _step(sch: Scheduler):
    out = sch.schedule()
    sch.update_from_output(out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
    return out


def test_a_stopping_refusal_counts_every_call_behind_it():
    """fcfs on 16 blocks: `a`'s 60 tokens hold 15 of them (16 once it decodes); `b`, `c`, `d`
    (30 tokens, 8 blocks each) queue behind it. The head has no room and stops admission with budget
    left: all three wait for room (counting only the refused head, or none, says 1 or 0)."""
    kv = KVCacheManager(16, BS, make_policy("lru"))
    sch = Scheduler(kv, 8, 100, admission="fcfs")
    a = _seq("a", 0, 60, max_tokens=50)
    sch.add_request(a)
    _step(sch)
    for i, rid in enumerate("bcd"):
        sch.add_request(_seq(rid, 1000 * (i + 1), 30))
    out = _step(sch)
    assert [s.seq.request_id for s in out.scheduled] == ["a"] and out.num_batched_tokens == 1
    assert [s.request_id for s in sch.waiting] == ["b", "c", "d"]
    assert out.num_room_waits == 3
    kv.check_integrity()


def test_a_candidate_held_with_room_is_not_counted_as_waiting_for_room():
    """short-alone, every refusal stopping (max_skips 0: all queued calls rank as starving, in
    arrival order), 48 blocks: `a` decodes toward 100 tokens (27 blocks to its end held or
    reserved). `f`, `h`, `x` arrive in that order. The short `f` (3 blocks) is admitted
    and finishes in the step; `h`'s 60 tokens (16 blocks) fit but would not finish, so the step
    holds it (`holds`); `x`'s 100 tokens (26 blocks) do not fit and stop admission. Only `x` waits
    for room: `h` waits for the short step, and counting it says 2."""
    kv = KVCacheManager(48, BS, make_policy("lru"))
    sch = Scheduler(kv, 8, 32, admission=make_admission("short-alone", max_skips=0))
    a = _seq("a", 0, 8, max_tokens=100)
    sch.add_request(a)
    _step(sch)
    for rid, start, n in (("f", 1000, 8), ("h", 2000, 60), ("x", 3000, 100)):
        sch.add_request(_seq(rid, start, n))
    out = _step(sch)
    assert sorted(s.seq.request_id for s in out.scheduled) == ["a", "f"]
    assert [s.request_id for s in sch.waiting] == ["h", "x"]
    assert all(s.status is SeqStatus.WAITING for s in sch.waiting)
    assert out.num_room_waits == 1
    kv.check_integrity()
