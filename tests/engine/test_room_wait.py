"""A queued session that cannot fit until a long running prefill ends is ranked by that wait, so
the prefill's growth takes its kept prefix, not the room of the short calls behind it (scheduler +
SAM + KV manager + the simulator's tiers, no model; `engine.room_wait`).

The scene of issue #9 (100 users): a long cold prefill A runs; session B's next call, whose kept
prefix is cached, waits for room until A ends; a short call D arrives behind it. The admission
keeps B's resident prefix from D, so D gets in only once that prefix shrinks. Ranked as due within
a turnaround, B's prefix outlived a waiting session C predicted back sooner than A ends, and D
waited for A's end; ranked by its wait (past 16 Q: the farthest band), A's chunks take B's prefix
(written down, reloaded when B's room opens) and D runs while A still prefills.
"""

from __future__ import annotations

import pytest

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.policies.sam import DUE_WITHIN_TURNAROUND, FIRST_BAND, band_class
from hintkv.cache.policies.sam_fine import FINE_DUE_WITHIN_TURNAROUND, fine_band_class
from hintkv.cache.sessions import SessionRegistry
from hintkv.engine import batching, room_wait
from hintkv.engine.admission import StepPlan
from hintkv.engine.sequence import SeqStatus, Sequence
from hintkv.sim.costs import CostModel
from hintkv.sim.profile import load_profile
from hintkv.sim.tiers import sim_tiers
from tests.engine.scheduler_helpers import BS, run_step, sam_scheduler, session_seq

NUM_BLOCKS = 40  # A's 31 blocks to its end + B's 7 kept: neither B nor D fits beside A at first
STEP_S = 0.1  # the scene's steps; the warm-up's take 0.5 s (turnaround Q ~1.5 s)
PREFILL_S_PER_TOKEN = 10.0  # the engine's measured prefill cost: A's 100+ tokens left >> 16 Q


def _seq(rid: str, sid: str, tokens: list[int]) -> Sequence:
    return session_seq(rid, sid, tokens, 2)


class Scene:
    def __init__(self, num_blocks: int = NUM_BLOCKS) -> None:
        self.clock, self.sessions, self.kv, self.sch = sam_scheduler(num_blocks, 8, 16, admission="srpt")
        self.kv.tiers = sim_tiers(self.kv, True, 64, self.clock, CostModel(load_profile("h200-llama3-8b")))

    def step(self, dt: float) -> None:
        run_step(self.sch)
        self.clock.run_until(self.clock() + dt)

    def cls(self, sid: str) -> int:
        return self.sessions.get("t", sid).rank_cls

    def run(self) -> dict[str, float]:
        """The scene; returns each scene call's first-token time."""
        b_tokens, c_tokens = list(range(1000, 1030)), list(range(2000, 2080))
        for i in range(3):  # C calls every 10 s (its own gap history: predicted back in ~10 s);
            self.clock.run_until(10.0 * i)  # B's first call leaves a 7-block context
            self.sch.add_request(_seq(f"c{i}", "c", c_tokens))
            if i == 2:
                self.sch.add_request(_seq("b0", "b", b_tokens))
            while self.sch.has_work():
                self.step(0.5)
        self.kv.tiers.costs.prefill_s_per_token = PREFILL_S_PER_TOKEN
        a = _seq("a", "a", list(range(3000, 3120)))  # 30 blocks, cold: 8 steps of 16 tokens
        b = _seq("b1", "b", b_tokens + [7, 7] + list(range(4000, 4016)))  # 7 blocks cached
        d = _seq("d", "d", list(range(5000, 5010)))
        self.sch.add_request(a)
        self.step(STEP_S)
        self.sch.add_request(b)
        assert self.sessions.get("t", "b").state.value == "active"
        first: dict[str, float] = {}
        for i in range(30):
            if i == 4:  # behind B in srpt's order (B's deadline passed first): B's prefix kept from it
                self.sch.add_request(d)
            self.step(STEP_S)
            if i == 2:
                self.b_class_during_a = self.cls("b")
                self.c_class_during_a = self.cls("c")
            for s in (a, b, d):
                if s.request_id not in first and s.num_output_tokens:
                    first[s.request_id] = self.clock()
            if not self.sch.has_work():
                break
        self.kv.check_integrity()
        self.sessions.check_integrity()
        return first


def test_a_short_call_behind_a_blocked_kept_prefix_runs_while_the_long_prefill_runs():
    scene = Scene()
    first = scene.run()
    # B waits for A's end (> 16 Q away at the engine's prefill cost): the farthest band, below C
    assert scene.b_class_during_a == FIRST_BAND < scene.c_class_during_a
    assert first["d"] < first["a"]  # D ran while A still prefilled
    assert first["a"] < first["b1"]  # B got its room once A ended (its prefix reloaded)
    assert scene.kv.tiers.counters.num_loaded > 0


def test_without_the_wait_the_blocked_prefix_ranks_due_and_the_short_call_waits(monkeypatch):
    """The same scene with the scheduler telling SAM nothing: B ranks as due within a turnaround,
    above C, A's chunks take C's blocks, and D starts only after A has ended (the stall). B's
    prefix must not lapse either (`room_wait.lapses`, tests/engine/test_room_lapse.py): let go,
    D takes it whatever SAM ranks."""
    monkeypatch.setattr(batching, "note_blocked", lambda *args: None)
    monkeypatch.setattr(batching, "lapses", lambda *args: False)
    scene = Scene()
    first = scene.run()
    assert scene.b_class_during_a >= DUE_WITHIN_TURNAROUND > scene.c_class_during_a
    assert first["d"] > first["a"]


@pytest.mark.parametrize("until", [0.0, 5.0])
def test_an_admitted_or_unblocked_session_ranks_as_in_flight_again(until):
    """`SessionRegistry.block`: setting the wait re-ranks the queued session; clearing it (the
    scheduler's `note_admitted`, or a wait that no longer holds) ranks it by its arrival again."""
    sessions = SessionRegistry()
    KVCacheManager(8, BS, make_policy("sam", sessions=sessions))
    s = sessions.on_arrival("t", "b", "b", now=1.0)
    assert s.rank_cls == DUE_WITHIN_TURNAROUND
    sessions.block(s.key, 1.0 + 100.0, now=1.0)  # Q = 1 s: 100 s away is the farthest band
    assert s.rank_cls == FIRST_BAND
    sessions.block(s.key, until, now=1.0)  # admitted (0.0), or room opens in 4 s: (2Q, 4Q]
    assert s.rank_cls == (DUE_WITHIN_TURNAROUND if until == 0.0 else FIRST_BAND + 3)
    sessions.on_done(s.key, [], now=2.0)
    version = s.rank_version
    sessions.block(s.key, 50.0, now=2.0)  # only a queued session is held back: no re-rank
    assert s.rank_version == version


@pytest.mark.parametrize("policy, bands, due", [("sam", band_class, DUE_WITHIN_TURNAROUND),
                                                ("sam-fine", fine_band_class, FINE_DUE_WITHIN_TURNAROUND)])
@pytest.mark.parametrize("since", [0.0, 0.5])
def test_a_blocked_in_flight_session_is_predicted_and_ranked_by_its_wait(policy, bands, due, since):
    """sam and sam-fine: a queued (ACTIVE) session blocked for 3 s (Q = 1 s) is next used in 3 s,
    in the band of 3 s, also when blocked in the very instant it arrives (`since` 0: the
    simulator's clock stands still inside a step); unblocked, it ranks by its arrival again."""
    sessions = SessionRegistry()
    kv = KVCacheManager(8, BS, make_policy(policy, sessions=sessions))
    s = sessions.on_arrival("t", "b", "b", now=1.0)
    now = 1.0 + since
    sessions.block(s.key, now + 3.0, now=now)
    q = sessions.predicted_turnaround()
    assert kv.pool.policy.next_use(s, now) == pytest.approx(3.0)
    assert kv.pool.policy.session_class(s, now) == bands(3.0, q) < due
    sessions.block(s.key, 0.0, now=now)
    assert kv.pool.policy.next_use(s, now) == pytest.approx(q - since)
    assert kv.pool.policy.session_class(s, now) == bands(q - since, q)


def _a_running() -> tuple[Scene, Sequence]:
    """A 20-block scene; a 60-token cold prefill `a` is scheduled (16 blocks to its end, its prompt
    left at `PREFILL_S_PER_TOKEN`)."""
    scene = Scene(20)
    scene.kv.tiers.costs.prefill_s_per_token = PREFILL_S_PER_TOKEN
    a = _seq("a", "a", list(range(3000, 3060)))
    scene.sch.add_request(a)
    scene.sch.schedule()
    return scene, a


def test_the_wait_counts_the_blocks_kept_for_skipped_candidates():
    """The room a candidate lacks is the admission's (`kept_free`): beside a 16-block prefill
    (4 blocks held, 12 reserved to its end) 4 blocks are free, 2 of them a skipped candidate's
    kept prefix, so a 3-block candidate is 1 block short until the prefill ends: its prompt left
    at 10 s a token (counting the kept blocks as room, it claimed no wait)."""
    scene, a = _a_running()
    kv, sch = scene.kv, scene.sch
    assert len(a.block_table) == 4
    kept = kv.pool.allocate(2)  # a skipped candidate's resident prefix: cached, free, kept
    for i, blk in enumerate(kept):
        kv.pool.register(blk, (7, i))
    kv.pool.release(kept)
    plan = StepPlan(reserved=12, kept={blk.block_id for blk in kept})
    b = _seq("b", "b", list(range(6000, 6008)))
    match = kv.match_prefix(b, lower=False)
    assert kv.free_room(match) - plan.reserved == 4
    left = (a.num_prompt_tokens - a.num_computed_tokens) * PREFILL_S_PER_TOKEN
    assert left > 0 and room_wait.earliest_room_s(sch, b, match, plan) == pytest.approx(left)


def _blocked_scene():
    """A 60-token cold prefill a runs (16 blocks to its end of 20); b's 8 blocks do not fit beside
    it: b is told its wait (a's prompt at 10 s a token) and ranks in the farthest band."""
    scene, a = _a_running()
    sch, sessions = scene.sch, scene.sessions
    b = _seq("b", "b", list(range(6000, 6030)))
    sch.add_request(b)
    sch.schedule()
    assert b.status is SeqStatus.WAITING and sessions.get("t", "b").blocked_until > scene.clock()
    assert sessions.get("t", "b").rank_cls == FIRST_BAND
    return sch, sessions, a, b


@pytest.mark.parametrize("leave", ["abort", "preempt"])
def test_a_prefill_that_leaves_early_clears_the_waits_it_caused(leave):
    """a is aborted (or preempted) before its end: b's room may open at once, so b ranks as in
    flight again (it kept the farthest band until its old estimate ran out)."""
    sch, sessions, a, b = _blocked_scene()
    if leave == "abort":
        sch.abort_request("a")
    else:
        sch.running.remove(a)
        sch.preempt(a)
    s = sessions.get("t", "b")
    assert s.blocked_until == 0.0 and s.rank_cls > FIRST_BAND


def test_a_session_stays_blocked_while_another_request_of_it_queues():
    """Two queued requests of b's session, one admitted: the session's wait is the other's too."""
    sch, sessions, a, b = _blocked_scene()
    b2 = _seq("b2", "b", list(range(7000, 7004)))
    b2.session_key = b.session_key
    sch.waiting.append(b2)  # queued behind b (not added: the registry's arrival count stays one)
    sch.waiting.remove(b)
    room_wait.note_admitted(sch, b, sch.clock(), first=True)
    assert sessions.get("t", "b").blocked_until > sch.clock()
    sch.waiting.remove(b2)
    room_wait.note_admitted(sch, b2, sch.clock(), first=True)
    assert sessions.get("t", "b").blocked_until == 0.0
