"""`srpt` / `srpt-alone` (engine/admission_srpt.py) in the real scheduler with a step clock (1 ms
per batched token): a prompt that arrives after a long prefill's `short-first` deadline passed
still overtakes it when its own work is shorter, and the long one is not starved (at most about
AGING times its own steps, also as a property over random arrivals)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hintkv.engine.admission_srpt import SrptAdmission
from tests.engine.test_admission_alone import long_first_token_step
from tests.engine.test_scheduler import make_seq
from tests.engine.test_scheduling_policies import make_sched, step

SRPT = ("srpt", "srpt-alone")


def aged_overtake(policy: str) -> dict[str, float]:
    """A 1280-token prompt (20 steps of a 64-token budget) computes 8 steps; then a 320-token one
    arrives (5 steps). The first-token times (s; 1 ms per batched token)."""
    sched, clock = make_sched(policy, blocks=1024, budget=64, seqs=8)
    sched.add_request(make_seq("long", list(range(1280)), 1))
    firsts = {}
    for _ in range(8):
        firsts |= step(sched, clock, 64)
    sched.add_request(make_seq("medium", list(range(5000, 5320)), 1))
    while sched.has_work():
        firsts |= step(sched, clock, 64)
    return firsts


@pytest.mark.parametrize("policy", SRPT)
def test_a_shorter_prompt_overtakes_an_aged_long_prefill(policy):
    """At the medium prompt's arrival the long one has 768 tokens left, 12 steps: under short-first
    its deadline (seen at step 1: 1 + 12) is before the medium's (9 + 5), so it runs on and the
    medium one waits for all of it; under srpt (1 + 4 x 12 against 9 + 4 x 5) the medium one's 320
    tokens come first, and the long one's first token comes after the same total work."""
    got, sf = aged_overtake(policy), aged_overtake("short-first")
    assert sf == {"long": pytest.approx(1.344), "medium": pytest.approx(1.600)}  # the long one first (64 of the medium tokens shared its last steps)
    assert got == {"medium": pytest.approx(0.512 + 0.320), "long": pytest.approx(1.600)}
    assert got["long"] + got["medium"] < sf["long"] + sf["medium"]  # 2.432 s against 2.944: the mean falls


# the long one's deadline (AGING x its 20 steps of budget) plus its own steps (20, or 40 at the
# capped chunk of srpt-alone), plus a few
BOUND = {"srpt": SrptAdmission.AGING * 20 + 20 + 4, "srpt-alone": SrptAdmission.AGING * 20 + 40 + 4}


@pytest.mark.parametrize("policy", SRPT)
def test_a_long_prefill_is_not_starved_by_a_stream_of_short_ones(policy):
    at = long_first_token_step(policy, [8])
    assert at is not None and at <= BOUND[policy], at


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=st.lists(st.integers(0, 40), min_size=1, max_size=12), policy=st.sampled_from(SRPT))
def test_no_starvation_property(arrivals, policy):
    """Whatever the stream of short arrivals (0-40 tokens each step), the long prefill gets its
    first token within its later deadline plus its own steps and the work that arrived before it."""
    at = long_first_token_step(policy, arrivals)
    assert at is not None, "the long prefill starved"
    assert at <= BOUND[policy] + 2 * 20, at
