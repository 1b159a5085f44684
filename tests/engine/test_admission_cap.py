"""`srpt-cap` (engine/admission_cap.py) and its price (engine/chunk_costs.py) with the real scheduler
and KV manager on an event clock, no model: each step lasts what a known chunk price says (the
forward pass's stand-in, as the simulator's cost model is), the policy fits that price from the
steps it sees, and a long prefill's chunk at a long context is cut to the step limit while
`srpt-drain` runs the whole budget; a second unfinished prefill sits out a step the first fills."""

from __future__ import annotations

import pytest

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.engine.chunk_costs import MIN_SAMPLES, ChunkCostFit
from hintkv.engine.outputs import ScheduledSeq, SchedulerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.sim.clock import EventClock
from tests.engine.scheduler_helpers import BS, run_step, seq_of

BUDGET = 64
A_S, B_S = 1e-3, 1e-5  # the price: a second a token, b a query-key pair


def price(n: int, c: int) -> float:
    return A_S * n + B_S * n * (c + n / 2)


def _step_of(rows: list[tuple[int, int]]) -> SchedulerOutput:
    """A step of `(new tokens, context)` rows on real sequences."""
    scheduled = []
    for i, (n, c) in enumerate(rows):
        seq = seq_of(f"r{i}", list(range(c + n)))
        seq.num_computed_tokens = c
        scheduled.append(ScheduledSeq(seq, n))
    return SchedulerOutput(scheduled)


def test_the_fit_recovers_the_price_and_ignores_short_chunks():
    fit = ChunkCostFit(min_tokens=8)
    rows = [[(64, c)] for c in range(0, 2000, 128)] + [[(64, 900), (1, 5000)]]
    for r in rows[:MIN_SAMPLES - 1]:
        fit.observe(_step_of(r), sum(price(n, c) for n, c in r))
    assert fit.chunk_s(64, 0) is None  # too few samples: no price, nothing is cut
    for r in rows[MIN_SAMPLES - 1:]:
        fit.observe(_step_of(r), sum(price(n, c) for n, c in r))
    fit.observe(_step_of([(4, 100)]), 99.0)  # a short chunk (launch-bound): not a sample
    assert fit.num_samples == len(rows)
    a, b = fit.coef()
    assert a == pytest.approx(A_S, rel=0.02) and b == pytest.approx(B_S, rel=0.02)
    limit = 3 * price(BUDGET, 0)
    m = fit.largest(1000, limit, 16, 64)
    assert price(m, 1000) <= limit * 1.02 < price(m + 2, 1000)  # the most tokens under the limit
    assert fit.largest(100_000, limit, 16, 64) == 16  # the floor
    assert fit.largest(0, limit, 16, 64) == 64  # the budget's chunk fits


class Scene:
    def __init__(self, admission: str, num_blocks: int = 4000) -> None:
        self.clock = EventClock()
        self.kv = KVCacheManager(num_blocks, BS, make_policy("lru"))
        self.sch = Scheduler(self.kv, 8, BUDGET, clock=self.clock, admission=admission)

    def step(self) -> dict[str, tuple[int, int]]:
        """One step lasting its price; returns each sequence's (chunk, context)."""
        rows = {}

        def forward(out: SchedulerOutput) -> None:
            rows.update({s.seq.request_id: (s.num_new_tokens, s.seq.num_computed_tokens) for s in out.scheduled})
            self.clock.run_until(self.clock() + sum(price(n, c) for n, c in rows.values()))
        run_step(self.sch, forward)
        return rows


@pytest.mark.parametrize("admission", ["srpt-cap", "srpt-drain"])
def test_a_long_chunk_at_a_long_context_is_cut_to_the_step_limit(admission):
    """A 3000-token cold prefill alone: its chunks are the budget until its context makes a
    budget's chunk cost more than 3 empty-context ones (and the fit has its samples); then each
    step costs at most that, down to the floor (16 = 64 / 4). srpt-drain: the budget throughout."""
    scene = Scene(admission)
    scene.sch.add_request(seq_of("long", list(range(3000))))
    chunks = []
    while scene.sch.has_work():
        chunks.append(scene.step()["long"])
    unfinished = [(n, c) for n, c in chunks if n + c < 3000]  # (the last chunk finishes: never cut)
    assert chunks[-2][0] > BUDGET // 4  # (61 tokens at 2939: whole)
    limit = 3 * price(BUDGET, 0)
    if admission == "srpt-drain":
        assert {n for n, _ in unfinished} == {BUDGET}
        return
    cut = [(n, c) for n, c in unfinished if n < BUDGET]
    assert cut and all(price(BUDGET, c) > limit for _, c in cut)  # only where the budget's chunk is over
    assert all(price(n, c) <= limit * 1.05 or n == BUDGET // 4 for n, c in cut)
    assert cut[-1][0] == BUDGET // 4  # at 2900 tokens of context the floor
    scene.kv.check_integrity()


def test_a_second_unfinished_prefill_sits_out_a_step_the_first_fills():
    """Two 3000-token prefills: a (first in srpt's order) has its chunks cut at a long context; the
    budget the cut leaves does not go to b, whose chunk would double the step the limit allows: b
    waits (without the hold, b rides in every cut step: the step stays long)."""
    scene = Scene("srpt-cap")
    scene.sch.add_request(seq_of("a", list(range(3000))))
    scene.sch.add_request(seq_of("b", list(range(10_000, 13_000))))
    cut = []  # the steps in which a's unfinished chunk was cut below the budget (once priced)
    while scene.sch.has_work():
        priced = scene.sch.admission.limit_s() is not None
        rows = scene.step()
        n, c = rows.get("a", (BUDGET, 0))
        if priced and n < BUDGET and n + c < 3000:
            cut.append(rows)
    assert len(cut) > 100
    assert not any("b" in r for r in cut)
    scene.kv.check_integrity()


def test_a_held_prefill_that_is_due_rides_beside_the_cut_chunk():
    """The hold's "unless due" (no starvation): with deadlines aged 1x (b's due after 3000 / 64 steps of
    its own work), b is scheduled beside a's cut chunk once due, though the step is then over the
    limit (review_sim22 finding 6: a hold that never lets a due prefill through fails this)."""
    scene = Scene("srpt-cap")
    scene.sch.admission.AGING = 1
    scene.sch.add_request(seq_of("a", list(range(3000))))
    scene.sch.add_request(seq_of("b", list(range(10_000, 13_000))))
    both = []  # steps that carry a's cut unfinished chunk and b's unfinished chunk
    while scene.sch.has_work():
        priced = scene.sch.admission.limit_s() is not None
        rows = scene.step()
        n, c = rows.get("a", (BUDGET, 0))
        nb, cb = rows.get("b", (0, 0))
        if priced and n < BUDGET and n + c < 3000 and nb > 1 and nb + cb < 3000:
            both.append(rows)
    assert both
    scene.kv.check_integrity()


@pytest.mark.parametrize("admission", ["srpt-cap", "srpt-drain"])
def test_a_capped_prefill_beside_a_refused_candidate_gets_its_top_up(admission):
    """review_rev23_a finding 1: a long prefill `a` runs; a longer `b` is refused for room (a reserves its
    blocks to its end, b's key is later than a's deadline: nothing lent). short-first's cap halves a's chunk
    while b waits; the top-up after the admissions asks `holds` with a's first part already in the step, which
    the hold priced twice (its own row and the grown chunk): at a context where a's whole budget chunk is under
    the limit, a ran half the budget in a step nothing else used (32 for 64). The rev23 reviewer's scene."""
    scene = Scene(admission, num_blocks=1000)  # a's 750 blocks to its end leave b too little
    if admission == "srpt-cap":  # the fit already has its samples (the price exactly)
        scene.sch.admission.costs = fit = ChunkCostFit(min_tokens=BUDGET // 8)
        for c in range(0, 2000, 128):
            fit.observe(_step_of([(64, c)]), price(64, c))
    a = seq_of("a", list(range(3000)))
    scene.sch.add_request(a)
    assert [scene.step() for _ in range(3)] == [{"a": (BUDGET, c)} for c in (0, 64, 128)]
    if admission == "srpt-cap":  # a's whole budget chunk is under the step limit at this context
        assert price(BUDGET, 192) <= scene.sch.admission.limit_s()
    scene.sch.add_request(seq_of("b", list(range(10_000, 13_000))))
    rows = scene.step()
    assert "b" not in rows  # refused for room: nothing else runs beside a
    assert rows["a"] == (BUDGET, 192)
