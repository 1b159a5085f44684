"""`srpt-swap` (engine/admission_srpt_swap.py): `srpt-drain` plus `prefill-judged`'s swaps. A call
whose room a decode holds gets it at once when the judge says the swap pays (where `srpt-drain`
waits for the decode's end), keeps waiting when it does not, and the swapped decode comes back with
the tokens it would have had on a device with room to spare."""

from __future__ import annotations

from tier_engine_helpers import BLOCK, run_arrivals, tiny_engine

from tests.engine.test_prefill_fair import ARRIVALS
from tests.engine.test_prefill_judged import swap_scenario


def test_a_call_without_room_swaps_the_decode_out_where_srpt_drain_waits_for_it():
    sched, first, end = swap_scenario(0.001, admission="srpt-drain")
    assert sched.num_preemptions == 0 and end["a"] < first["b"]  # no swap: b waits for a's room
    sched, first, end = swap_scenario(0.001, admission="srpt-swap")
    assert sched.num_preemptions == 1 and sched.admission.num_declined == 0
    assert first["b"] < end["a"]  # a was swapped out for b, then came back and ended


def test_a_swap_that_does_not_pay_is_declined():
    # b's prefill at 50 ms a token costs more than the wait a's end saves it (prefill-judged's scene)
    sched, first, end = swap_scenario(0.05, admission="srpt-swap")
    assert sched.admission.num_declined > 0 and sched.num_preemptions == 0
    assert end["a"] < first["b"]


def test_outputs_on_the_engine_are_a_roomy_devices():
    reference = run_arrivals(tiny_engine(kv_tokens=64 * BLOCK), ARRIVALS)[0]
    engine = tiny_engine(host_cache_memory="4MiB", scheduling_policy="srpt-swap", eviction_policy="sam")
    out, first, end = run_arrivals(engine, ARRIVALS)
    assert out == reference
    assert engine.scheduler.admission.name == "srpt-swap" and engine.scheduler.num_preemptions > 0
