"""The cache reports edit outcomes as numbers; the server words them (`server/edit_notes.py`)."""

from __future__ import annotations

from hintkv.cache.hashing import namespace_root
from hintkv.config import EngineConfig
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import CacheEdit, EditOutcome, SamplingParams, SessionRef
from hintkv.server.edit_notes import edit_notes

BS = 4
REF = SessionRef("t", "s", "s")


def _scheduler_with_a_session(**cfg) -> Scheduler:
    sched = Scheduler.from_config(EngineConfig(block_size=BS, **cfg), 16)
    seq = Sequence("r", list(range(10, 23)), 13, SamplingParams(temperature=0, max_tokens=1),
                   namespace_root("m", "float32", BS, None), session=REF)
    sched.add_request(seq)
    while sched.has_work():
        out = sched.schedule()
        sched.update_from_output(out, ModelRunnerOutput.from_tokens(
            [7 if s.samples else None for s in out.scheduled]))
    return sched


def test_outcomes_carry_numbers_and_the_server_words_them():
    sched = _scheduler_with_a_session()
    (off,) = sched.manage(REF, [CacheEdit("offload")])
    assert (off.action, off.lower_tier, off.num_held, off.num_on_device) == ("offloaded", None, 3, 3)
    assert edit_notes(off) == [("no lower tier configured: 3 device blocks of this session are now "
                                "first in line for eviction (kept until room is needed)")]
    (pre,) = sched.manage(REF, [CacheEdit("prefetch")])
    assert edit_notes(pre) == ["3 of the session's 3 blocks are in device memory and now protected"]
    (ev,) = sched.manage(REF, [CacheEdit("evict")])
    assert ev.action == "evicted" and ev.tiers["device"] == (-3, -12) and edit_notes(ev) == []
    (ghost,) = sched.manage(SessionRef("t", "ghost", "ghost"), [CacheEdit("evict")])
    assert (ghost.action, ghost.reason) == ("none", "unknown_session")
    assert edit_notes(ghost) == ["unknown session: nothing to do"]


def test_ignored_hints_and_engine_errors_are_worded():
    sched = _scheduler_with_a_session(hints=False)
    (o,) = sched.manage(REF, [CacheEdit("evict")])
    assert edit_notes(o) == ["hints are ignored by this server (--ignore-hints)"]
    err = EditOutcome("skipped", reason="engine_error", detail="boom")
    assert edit_notes(err) == ["engine error: boom"]
