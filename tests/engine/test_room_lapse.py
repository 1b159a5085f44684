"""A skipped candidate's kept prefix lapses when its wait for room is longer than its reload
(`engine.room_wait.lapses`, checked in `batching.admit_waiting`): the real Scheduler, KV manager
and the simulator's tiers, hints off (the rule is engine knowledge: lru runs get it too), no model.

The scene: a long cold prefill A runs; B's next call, whose 30-block prefix is cached, waits for
room until A ends; a short call D arrives behind it in srpt's order. The admission keeps B's
resident prefix from D, so with it kept D waits for A's end. When A's remaining prefill takes
longer than reloading B's prefix, holding the blocks idle costs more than getting them back:
the prefix lapses and D runs while A still prefills, on room that part of B's prefix held (they
go down to the host tier and load back for B). When the reload costs more than the wait (a slow
tier), B keeps its prefix and D waits, unless recomputing B's prefix costs less than the wait.
Under prefill-fair / prefill-judged a displaced decode that is due has its room reserved beside
its resident prefix (`engine.admission_swap`): that prefix never lapses.
"""

from __future__ import annotations

from functools import partial

import pytest

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.types import SessionRef
from hintkv.engine import batching, room_wait
from hintkv.engine.admission import StepPlan, make_admission
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.room_wait import lapses
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams
from hintkv.sim.clock import EventClock
from hintkv.sim.costs import CostModel
from hintkv.sim.profile import load_profile
from hintkv.sim.tiers import sim_tiers
from tests.engine.scheduler_helpers import BS, ROOT

B_PREFIX = 120  # B's first prompt: 30 blocks cached
D_LEN = 30  # D's prompt: 8 blocks to its end, more than the 2 free beside A's and B's: it takes B's
PREFILL_S_PER_TOKEN = 1.0  # A's ~40 tokens left when D comes: ~40 s; B's recompute 4 s a block
FAST_LOAD_S = 1e-3  # a block from the host tier: 30 ms for B's prefix, far below the wait
SLOW_LOAD_S = 1e3  # slower than recomputing: B's prefix costs 120 s to get back, above the wait
STEP_S = 0.1


def _seq(rid: str, sid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, tokens, len(tokens), SamplingParams(temperature=0, max_tokens=2), ROOT,
                    session=SessionRef("t", sid, sid))


def _run(load_s: float, b_prefix: int = B_PREFIX, admission: str = "srpt", due: bool = False,
         shared: bool = False) -> tuple[dict[str, float], dict[str, int], int]:
    """The scene; returns each scene call's first-token time, its cached prompt tokens and the
    blocks loaded from the host tier. `due`: B's call is a displaced decode that is due (under
    prefill-fair: its room is reserved); `shared`: a call C of B's prefix waits behind it too."""
    clock = EventClock()
    num_blocks = 31 + b_prefix // BS + 2  # A's 31 blocks to its end + B's kept + 2
    kv = KVCacheManager(num_blocks, BS, make_policy("lru"))
    kv.tiers = sim_tiers(kv, False, 64, clock, CostModel(load_profile("h200-llama3-8b")))
    sch = Scheduler(kv, 8, 16, clock=clock, admission=admission)

    def step(dt: float) -> None:
        out = sch.schedule()
        kv.flush_write_downs()
        sch.update_from_output(out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
        clock.run_until(clock() + dt)

    b_tokens = list(range(1000, 1000 + b_prefix))
    sch.add_request(_seq("b0", "b", b_tokens))
    while sch.has_work():
        step(0.5)
    costs = kv.tiers.costs  # the engine's measured costs (set: no forward pass measures them here)
    costs.prefill_s_per_token = PREFILL_S_PER_TOKEN
    costs.bandwidth["host"] = costs.block_bytes / load_s
    a = _seq("a", "a", list(range(3000, 3120)))  # 30 blocks, cold: 8 steps of 16 tokens
    b = _seq("b1", "b", b_tokens + [7, 7] + list(range(4000, 4016)))
    c = _seq("c", "c", b_tokens + [7, 7] + list(range(6000, 6016)))  # B's prefix, its own suffix
    d = _seq("d", "d", list(range(5000, 5000 + D_LEN)))
    sch.add_request(a)
    step(STEP_S)
    if due:  # swapped out after its first token, overtaken by max_overtakes new prefills since
        b.first_token_time = 0.0
    sch.add_request(b)
    if due:
        sch.admission.overtaken["b1"] = sch.admission.max_overtakes
    if shared:
        sch.add_request(c)
    scene = [a, b, d, c] if shared else [a, b, d]
    first: dict[str, float] = {}
    cached: dict[str, int] = {}
    for i in range(40):
        if i == 4:  # behind B in srpt's order (B's deadline passed first)
            sch.add_request(d)
        step(STEP_S)
        for s in scene:
            if s.request_id not in first and s.num_output_tokens:
                first[s.request_id] = clock()
                cached[s.request_id] = s.num_cached_tokens
        if not sch.has_work():
            break
    kv.check_integrity()
    assert set(first) == {s.request_id for s in scene}
    return first, cached, kv.tiers.stats()["num_loaded"]


def _kept(monkeypatch) -> None:
    """The rule off: every skipped candidate keeps its resident prefix."""
    monkeypatch.setattr(batching, "lapses", lambda *args: False)


def test_a_wait_longer_than_the_reload_lets_the_prefix_lapse_and_the_short_call_runs(monkeypatch):
    first, cached, loaded = _run(FAST_LOAD_S)
    assert first["d"] < first["a"]  # D ran while A still prefilled ...
    assert loaded > 0  # ... on room part of B's prefix held: it went down and loaded back
    assert cached["b1"] == B_PREFIX  # B computed none of it again
    assert first["a"] < first["b1"]  # B got its room once A ended
    _kept(monkeypatch)
    kept, _, _ = _run(FAST_LOAD_S)
    # what the calls admitted into B's room add to B's wait after A's end: one step here (the
    # bound is the policy's max_skips: room_wait.lapses)
    assert first["b1"] - first["a"] <= kept["b1"] - kept["a"] + STEP_S + 1e-9


def test_a_wait_shorter_than_the_reload_keeps_the_prefix():
    first, cached, loaded = _run(SLOW_LOAD_S)
    assert first["a"] < first["d"]  # D waited for A's end: B's prefix stayed kept from it
    assert cached["b1"] == B_PREFIX and loaded == 0  # and B found all of it on the device


def test_a_prefix_cheaper_to_recompute_than_the_wait_lapses_beside_a_slow_tier():
    """B's 8-block prefix recomputes in 32 s, less than A's ~40 s left; loading it would take
    8,000 s: the cheaper of the two (`TransferCosts.regain_s`) prices the lapse."""
    first, _, _ = _run(SLOW_LOAD_S, b_prefix=32)
    assert first["d"] < first["a"]


@pytest.mark.parametrize("load_s", [FAST_LOAD_S, SLOW_LOAD_S])
def test_without_the_lapse_the_short_call_waits_for_the_long_prefill(monkeypatch, load_s):
    """The rule off: whatever the reload costs, B's prefix is kept and D waits for A's end."""
    _kept(monkeypatch)
    first, cached, _ = _run(load_s)
    assert first["a"] < first["d"]
    assert cached["b1"] == B_PREFIX


@pytest.mark.parametrize("admission", ["prefill-fair", "prefill-judged"])
def test_a_due_displaced_decode_keeps_its_prefix_beside_its_reserved_room(admission):
    """Its room is reserved for the blocks past its resident prefix only: lapsed, D would take
    room the decode needs to come back (D first at 5.1 s, the decode at 5.7 s instead of 5.6 s)."""
    first, cached, _ = _run(FAST_LOAD_S, admission=admission, due=True)
    assert first["a"] < first["b1"] <= first["d"]
    assert cached["b1"] == B_PREFIX


def test_a_not_due_displaced_decode_lets_its_prefix_lapse():
    """prefill-fair's order ages faster than srpt's: D goes after A, but ahead of B (kept, B's
    prefix keeps D waiting until B's room opens: B first at 5.5 s, D at 5.7 s)."""
    first, _, _ = _run(FAST_LOAD_S, admission="prefill-fair")
    assert first["d"] < first["b1"]


def test_a_later_candidate_that_lapses_leaves_an_earlier_ones_share_kept():
    """C shares the due decode B's prefix and waits behind it; C's prefix lapses (not due), the
    blocks B keeps stay kept: D still waits for B."""
    first, _, _ = _run(FAST_LOAD_S, admission="prefill-fair", due=True, shared=True)
    assert first["a"] < first["b1"] <= first["d"]



def test_the_wait_is_estimated_only_where_it_is_used():
    """`earliest_room_s` sorts every running sequence, up to max_scan times a step: it runs only
    where a hinted session is ranked by it or a policy asks whether a kept prefix lapses."""
    clock = EventClock()
    kv = KVCacheManager(40, BS, make_policy("lru"))
    kv.tiers = sim_tiers(kv, False, 64, clock, CostModel(load_profile("h200-llama3-8b")))
    sch = Scheduler(kv, 8, 16, clock=clock, admission="srpt")  # no SAM: hints off
    b_tokens = list(range(1000, 1000 + B_PREFIX // 4))
    sch.add_request(_seq("b0", "b", b_tokens))
    while sch.has_work():
        out = sch.schedule()
        sch.update_from_output(out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
    b, cold = _seq("b1", "b", b_tokens + [7, 7, 1, 2]), _seq("c", "c", [9] * 20)
    asked: list[str] = []

    def wait(rid: str):
        return lambda: asked.append(rid) or 1e3

    for seq in (b, cold):
        match = kv.match_prefix(seq, keep=True, lower=False)
        room_wait.note_blocked(sch, seq, wait(seq.request_id), 0.0)  # hints off: nothing ranked
        assert not make_admission("fcfs").skipped(seq, match, StepPlan(), partial(lapses, sch, match, wait("fcfs")))
        starving = make_admission("srpt")
        starving.skips[seq.request_id] = starving.max_skips
        assert not starving.skipped(seq, match, StepPlan(), partial(lapses, sch, match, wait("starving")))
        plan = StepPlan()
        assert make_admission("srpt").skipped(seq, match, plan, partial(lapses, sch, match, wait(seq.request_id)))
        assert not plan.kept  # lapsed (a cold one has nothing to keep)
    assert asked == ["b1"]  # the skipped candidate with a resident prefix, once
