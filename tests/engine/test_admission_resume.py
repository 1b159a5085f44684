"""`srpt-resume` (engine/admission_resume.py) with the real scheduler, SAM, KV manager and the
simulator's tiers on an event clock, no model: a long prefill's chunk is cut to end by the time SAM
predicts a session away on its tool calls again, so that call does not wait for the whole chunk;
without hints (nothing predicted) or under srpt-drain the chunk is the whole budget."""

from __future__ import annotations

import math

import pytest

from hintkv.engine import batching
from hintkv.sim.costs import CostModel
from hintkv.sim.profile import load_profile
from hintkv.sim.tiers import sim_tiers
from tests.engine.scheduler_helpers import BS, run_step, sam_scheduler, session_seq

BUDGET = 64
TOKEN_S = 0.02  # the engine's prefill cost a token: a whole 64-token chunk is 1.28 s
GAP_S = 10.0  # session c calls every 10 s (its own gap history predicts the next call)


def _seq(rid: str, sid: str, tokens: list[int], max_tokens: int = 1):
    return session_seq(rid, sid, tokens, max_tokens)


class Scene:
    def __init__(self, admission: str, hints: bool) -> None:
        self.clock, _, self.kv, self.sch = sam_scheduler(400, 8, BUDGET, admission=admission, hints=hints)
        self.kv.tiers = sim_tiers(self.kv, True, 64, self.clock, CostModel(load_profile("h200-llama3-8b")))

    def step(self) -> dict[str, int]:
        out, _ = run_step(self.sch)
        self.clock.run_until(self.clock() + 0.01)
        return {s.seq.request_id: s.num_new_tokens for s in out.scheduled}

    def first_long_chunk(self) -> int:
        """c's three calls (gaps of 10 s), then a 1200-token cold prefill 0.9 s before c's
        predicted next call; returns the tokens of the prefill's first chunk."""
        for i in range(3):
            self.clock.run_until(GAP_S * i)
            self.sch.add_request(_seq(f"c{i}", "c", list(range(100 * i, 100 * i + 8))))
            while self.sch.has_work():
                self.step()
        back = self.clock() - 0.01 + GAP_S  # c's last end + its predicted gap
        self.kv.tiers.costs.prefill_s_per_token = TOKEN_S
        self.clock.run_until(back - 0.9)
        self.sch.add_request(_seq("long", "a", list(range(5000, 6200))))
        return self.step()["long"]


@pytest.mark.parametrize("admission, hints, chunk", [
    ("srpt-resume", True, 45),  # 0.9 s / 0.02 s a token: ends by c's predicted call
    ("srpt-resume", False, BUDGET),  # no hints: no session is known, nothing predicted
    ("srpt-drain", True, BUDGET),
])
def test_a_long_chunk_ends_by_the_next_predicted_call(admission, hints, chunk):
    scene = Scene(admission, hints)
    assert scene.first_long_chunk() == pytest.approx(chunk, abs=1)
    scene.kv.check_integrity()


def test_a_finishing_chunk_is_not_cut_and_the_cut_has_a_floor():
    """Past the prediction's time nothing is predicted; a chunk that finishes its prompt is whole;
    a predicted call within a token still leaves the prefill 1/32 of the budget."""
    scene = Scene("srpt-resume", True)
    adm = scene.sch.admission
    adm.order_running([], BUDGET)
    adm._left_s, adm._token_s = 0.001, TOKEN_S
    assert adm.chunk(BUDGET, BUDGET) == BUDGET  # it finishes: whole
    assert adm.chunk(1000, BUDGET) == BUDGET // 32


def _before_the_return(scene: Scene, at_s: float) -> None:
    """c's three calls 10 s apart, then the clock `at_s` before c's predicted next call, a decode
    ("hog", 100 blocks to its end) running."""
    for i in range(3):
        scene.clock.run_until(GAP_S * i)
        scene.sch.add_request(_seq(f"c{i}", "c", list(range(100 * i, 100 * i + 8))))
        while scene.sch.has_work():
            scene.step()
    back = scene.clock() - 0.01 + GAP_S
    scene.kv.tiers.costs.prefill_s_per_token = TOKEN_S
    scene.clock.run_until(back - 3)
    scene.sch.add_request(_seq("hog", "h", list(range(9000, 9040)), 360))
    while not scene.sch.requests["hog"].num_output_tokens:
        scene.step()
    scene.clock.run_until(back - at_s)


@pytest.mark.parametrize("with_refused", [False, True])
def test_a_chunk_asked_for_and_not_run_spends_nothing(with_refused):
    """A candidate the room rule refuses ("big": 410 blocks to its end) is asked for its chunk
    before "long" runs: that chunk never runs, so long's chunk still ends by c's predicted call
    (0.9 s / 0.02 s less the decode's token: 43), not at the floor (2: review_resume1 finding 1)."""
    scene = Scene("srpt-resume", True)
    _before_the_return(scene, 0.9)
    if with_refused:
        scene.sch.add_request(_seq("big", "b", list(range(20000, 20200)), 1440))
    scene.sch.add_request(_seq("long", "a", list(range(5000, 5800)), 1))
    assert scene.step() == {"hog": 1, "long": 43}
    scene.kv.check_integrity()


def test_two_chunks_in_one_step_end_by_the_predicted_call_together():
    """Two prefills longer than the step (300 and 400 tokens) 0.9 s before c's call: the first (in srpt's order) takes the 43 tokens
    that end by it beside the decode, the second only the floor (2 = 64 / 32), not the 20 the budget
    leaves: the step's tokens are what is spent."""
    scene = Scene("srpt-resume", True)
    _before_the_return(scene, 0.9)
    scene.sch.add_request(_seq("long", "a", list(range(5000, 5300)), 1))
    scene.sch.add_request(_seq("long2", "d", list(range(7000, 7400)), 1))
    got = scene.step()
    assert got["hog"] == 1 and sorted(v for k, v in got.items() if k != "hog") == [2, 43]


@pytest.mark.parametrize("big_max, short, held", [(1361, 91, True), (1401, 101, False)])
def test_a_hold_counts_only_the_room_the_decodes_free(big_max, short, held):
    """srpt-drain's hold (srpt-resume's too: `SrptDrainAdmission._drains`) counts the blocks the step's DECODES
    free at their end (review_room2a finding 3I). "big" (200 tokens, first in srpt's order) is refused for room
    0.9 s before c's call, lacking `short` blocks; the hog decode's end frees 100. Lacking 91, the decode covers
    it: both longer prefills (keys after big's) sit out the step. Lacking 101, no hold: long takes the 43 tokens
    that end by c's call and long2 the floor (2). Counting long's admitted chunk as room its end frees (the
    `_decoding` filter dropped) held long2 there: {"hog": 1, "long": 43}."""
    scene = Scene("srpt-resume", True)
    _before_the_return(scene, 0.9)
    scene.sch.add_request(_seq("big", "b", list(range(20000, 20200)), big_max))
    scene.sch.add_request(_seq("long", "a", list(range(5000, 5300))))
    scene.sch.add_request(_seq("long2", "d", list(range(7000, 7400))))
    got = scene.step()
    assert scene.sch.admission._refused.short == short  # the scene: what big lacks beyond free and lendable
    assert got == ({"hog": 1} if held else {"hog": 1, "long": 43, "long2": 2})
    scene.kv.check_integrity()


def _c_calls(scene: Scene, times: list[float]) -> None:
    for i, t in enumerate(times):
        scene.clock.run_until(t)
        scene.sch.add_request(_seq(f"c{i}", "c", list(range(100 * i, 100 * i + 8))))
        while scene.sch.has_work():
            scene.step()


def test_next_return_counts_only_a_waiting_session_at_its_latest_end():
    """SAM's prediction that srpt-resume reads (review_resume1 finding 2): c's last end plus its
    predicted gap; none while c has a call in flight or once that time has passed. (Dropping
    `not s.num_inflight` or `s.last_done == last_done` alone passes: a session with a call in flight
    is not waiting, and the scheduler's next step pops its older entry then.)"""
    scene = Scene("srpt-resume", True)
    sam, sessions = scene.sch.sam, scene.sch.sam.sessions
    _c_calls(scene, [0.0, GAP_S, 2 * GAP_S])
    c = next(s for s in sessions.sessions.values() if s.key.endswith("c"))
    back = c.last_done + sessions.predicted_gap(c)[0]
    now = scene.clock()
    assert back > now and sam.next_return(now) == pytest.approx(back)
    scene.clock.run_until(back - 1.0)
    scene.sch.add_request(_seq("c3", "c", list(range(900, 908))))  # c calls again: in flight
    assert sam.next_return(scene.clock()) == math.inf
    while scene.sch.has_work():
        scene.step()
    newer = c.last_done + sessions.predicted_gap(c)[0]
    assert scene.clock() < back < newer
    assert sam.next_return(scene.clock()) == pytest.approx(newer)
    assert sam.next_return(newer + 1e-6) == math.inf  # past the prediction: nothing


def test_next_return_forgets_a_suspended_session():
    scene = Scene("srpt-resume", True)
    _c_calls(scene, [0.0, GAP_S, 2 * GAP_S])
    sam = scene.sch.sam
    assert sam.next_return(scene.clock()) < math.inf
    sam.sessions.suspend(next(k for k in sam.sessions.sessions if k.endswith("c")))
    assert sam.next_return(scene.clock()) == math.inf  # not waiting on its tool any more


@pytest.mark.parametrize("at_s", [0.9, 1.2])
def test_the_capped_top_up_keeps_the_cut(at_s):
    """"long" (107 tokens) took its cut chunk; in the next step its rest (at most 64 to go) fits a step's budget but
    not what the step leaves beside "cand", so it is capped and topped up after the admissions: the top-up asks
    with what the step can still give, so the step's tokens stay within the time to c's predicted call
    (review_sim20 finding 1: asked with the whole prompt, the top-up gave back the cut, 64 tokens = 1.28 s)."""
    scene = Scene("srpt-resume", True)
    _before_the_return(scene, at_s)
    scene.sch.add_request(_seq("long", "a", list(range(5000, 5107)), 1))
    first = scene.step()
    assert 107 - first["long"] <= BUDGET  # the rest fits a step: a cut would not be asked for by itself
    scene.sch.add_request(_seq("cand", "e", list(range(7000, 7100)), 1))
    left_s = scene.sch.admission.returns()[0]  # this step's time to c's call, as the policy reads it
    got = scene.step()
    assert sum(got.values()) == int(left_s / TOKEN_S)  # the time to c's call, to the token
    scene.kv.check_integrity()


@pytest.mark.parametrize("at_s", [0.9, 1.2])
def test_the_capped_top_up_gives_back_what_the_cut_allows(at_s, monkeypatch):
    """As above, but the waiting candidate ("big": 410 blocks to its end) is refused for room: long is capped to half
    the budget while it waits (31 tokens beside the decode), and after the admissions the top-up gives long back
    what the time to c's call allows (0.9 s: 43 tokens beside the decode), or its whole rest where that ends first
    (1.2 s: the 49 left); without the top-up it stays at 31 (review_sim21 finding 3)."""
    scene = Scene("srpt-resume", True)
    _before_the_return(scene, at_s)
    scene.sch.add_request(_seq("long", "a", list(range(5000, 5107)), 1))
    rest = 107 - scene.step()["long"]
    scene.sch.add_request(_seq("big", "b", list(range(20000, 20200)), 1440))
    left_s = scene.sch.admission.returns()[0]
    long = next(q for q in scene.sch.running if q.request_id == "long")
    first_pass, admit_waiting = [], batching.admit_waiting

    def admit(sch, out, *args, **kw):  # the real admissions; what the first pass scheduled, recorded
        first_pass.append({s.seq.request_id: s.num_new_tokens for s in out.scheduled})
        return admit_waiting(sch, out, *args, **kw)

    monkeypatch.setattr(batching, "admit_waiting", admit)
    got = scene.step()
    # the first pass ran long cut to half the budget beside the decode while big waits (review_sim21b finding 12,
    # review_sim22 finding 2: without the cut, or with the cap's answer dropped, long took its chunk whole there,
    # the top-up never ran, and the step came out the same)
    assert first_pass == [{"hog": 1, "long": BUDGET // 2 - 1}]
    assert "big" not in got  # refused for room: the step's budget is left to the top-up
    assert got == {"hog": 1, "long": min(int(left_s / TOKEN_S) - 1, rest)}
    # the top-up's growth counts in the request's peak (review_sim21b finding 1: it grew the table unrecorded)
    assert long.peak_kv_blocks >= -(-long.num_computed_tokens // BS)
    scene.kv.check_integrity()
