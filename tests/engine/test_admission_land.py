"""`srpt-land` (engine/admission_land.py) with the real scheduler, SAM, KV manager and the simulator's host
tier (the real HostTier / TierConnector, copies timed by the VirtualMover) on an event clock, no model:
each step lasts what a known chunk price says, and the policy fits that price from the steps it sees.
A long cold prefill runs; a call whose prefix the host holds arrives, the long prefill yields to it, it
is admitted LOADING, and the long prefill's chunk in that step is cut to end by the load's expected
landing, so the call computes in the next step instead of after a whole budget's chunk."""

from __future__ import annotations

import math

import pytest
import torch

from hintkv.cache.hashing import hash_blocks
from hintkv.engine.admission import make_admission
from hintkv.sim.costs import CostModel
from hintkv.sim.profile import load_profile
from hintkv.sim.tiers import sim_tiers
from tests.engine.scheduler_helpers import BS, ROOT, run_step, sam_scheduler, session_seq
from tests.engine.test_admission_cap import _step_of
from tests.engine.test_admission_cap import price as cap_price

BUDGET = 64
A_S, B_S = 1e-5, 3e-8  # the price: a second a token, b a query-key pair (a 64-token chunk at 1.3K: 3.2 ms)
HELD = 100  # blocks of b's prefix on the host: 52 MB at the profile's 55 GB/s, ~1.1 ms
ARRIVES = 20  # b's call comes at this step (the fit has its 8 samples by then)


def price(n: int, c: int) -> float:
    return A_S * n + B_S * n * (c + n / 2)


class Scene:
    def __init__(self, admission: str) -> None:
        self.clock, _, self.kv, self.sch = sam_scheduler(4000, 8, BUDGET, admission=admission)
        self.kv.tiers = sim_tiers(self.kv, True, 4 * HELD, self.clock, CostModel(load_profile("h200-llama3-8b")))
        self.b_tokens = list(range(100_000, 100_000 + HELD * BS + 20))
        layout = self.kv.tiers.stack.layout
        hashes = hash_blocks(ROOT, self.b_tokens, BS)[:HELD]
        futures = self.kv.tiers.stack.store([(h, torch.ones(layout.shape, dtype=layout.dtype)) for h in hashes])
        while self.clock.run_next():
            pass
        assert all(f.result() for f in futures)
        self.steps: list[tuple[float, dict[str, tuple[int, int]], float]] = []  # (start, rows, landing in)

    def step(self) -> None:
        rows: dict[str, tuple[int, int]] = {}
        start = self.clock()

        def forward(out) -> None:
            rows.update({s.seq.request_id: (s.num_new_tokens, s.seq.num_computed_tokens) for s in out.scheduled})
            self.steps.append((start, rows, self.sch.next_landing()))
            self.clock.run_until(self.clock() + sum(price(n, c) for n, c in rows.values()))
        run_step(self.sch, forward)

    def run(self) -> dict[str, float]:
        """Steps until done; returns each request's first-token time."""
        self.sch.add_request(session_seq("long", "a", list(range(3000)), 2))
        first: dict[str, float] = {}
        while self.sch.has_work() or len(self.steps) < ARRIVES:
            if len(self.steps) == ARRIVES:
                self.sch.add_request(session_seq("b", "b", self.b_tokens, 2))
            if not self.sch.has_work():
                break
            self.step()
            for r in self.sch.running + [s for s in self.sch.waiting]:
                if r.first_token_time is not None:
                    first.setdefault(r.request_id, self.clock())
            self.kv.check_integrity()
        return first


@pytest.mark.parametrize("admission", ["srpt-land", "srpt-drain"])
def test_a_long_chunk_ends_by_the_landing_of_a_load_in_flight(admission):
    scene = Scene(admission)
    scene.run()
    arrival = scene.steps[ARRIVES]  # the step b's call arrived in: admitted LOADING, its load started
    _, rows, landing = arrival
    assert "b" not in rows and math.isfinite(landing)  # loading, not computing
    assert 0 < landing < price(BUDGET, rows["long"][1])  # the load lands well before a budget's chunk
    before = [r["long"] for _, r, _ in scene.steps[:ARRIVES]]
    assert all(n == BUDGET for n, _ in before)  # no load in flight: nothing is cut
    n, c = rows["long"]
    if admission == "srpt-drain":
        assert n == BUDGET
    else:
        # the most tokens whose chunk ends by the landing (the fit's price is the exact one: 2 tokens' slack)
        assert BUDGET // 8 < n < BUDGET and price(n, c) <= landing * 1.02 < price(n + 2, c)
    # b computes in the first step that starts after its load landed (the estimate leaves out the link's
    # latency: under srpt-land the load is late for the step cut to its estimate, and the long prefill
    # takes floor-sized chunks until it lands)
    landed = arrival[0] + scene.kv.tiers.stack.mover.transfer_s("host->device", HELD, idle=True)
    b_step = next(i for i, (_, r, _) in enumerate(scene.steps) if "b" in r)
    assert scene.steps[b_step][0] >= landed
    assert all(t < landed for t, _, _ in scene.steps[ARRIVES + 1:b_step])
    if admission == "srpt-drain":
        assert b_step == ARRIVES + 1
    else:
        assert all(r["long"][0] == BUDGET // 8 for _, r, _ in scene.steps[ARRIVES + 1:b_step])
    assert all(math.isinf(nl) for _, _, nl in scene.steps[b_step:])  # landed: nothing in flight


def test_the_loading_call_starts_computing_sooner():
    """b's first step starts at its load's landing under srpt-land, after a whole budget's chunk under srpt-drain."""
    starts = {}
    for admission in ("srpt-land", "srpt-drain"):
        scene = Scene(admission)
        scene.run()
        starts[admission] = next(t for t, r, _ in scene.steps if "b" in r) - scene.steps[ARRIVES][0]
    assert starts["srpt-land"] < 0.5 * starts["srpt-drain"]


def test_a_chunk_asked_after_the_step_filled_while_a_load_is_overdue_is_the_floor():
    """review_rev23_b finding 4: a load overdue (`left` = 0) and tokens already in the step (priced at a x used)
    gave `ChunkCostFit.largest` a negative limit, whose square root at a short context raised ValueError (math
    domain error) out of the scheduler; the chunk is the floor instead."""
    policy = make_admission("srpt-land")
    policy.order_running([], 64)  # the step's budget: 64 (the fit's samples: chunks of 8+)
    for c in range(0, 2000, 128):
        policy.costs.observe(_step_of([(64, c)]), cap_price(64, c))
    policy.attach_landings(lambda: 0.0)  # a load in flight, already overdue
    # a 3000-token prompt's first chunk (context 0), asked with 51 tokens already in the step: 13 left
    assert policy.chunk(3000, 13, used=51, done=0) == 64 // 8
