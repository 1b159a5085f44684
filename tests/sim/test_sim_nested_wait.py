"""Two instances on one clock under same-step: instance 2's step runs inside instance 1's load wait
and its own load has not landed. It does not wait (`EventClock.wait_for`: one wait at a time), so
its host hit computes one step later and the declined wait is counted; instance 1 resumes when its
own load lands (before: when instance 2's landed, half a copy later)."""

from __future__ import annotations

from test_sim_load_timing import A, BS, C, D, F, _drain, _engine, _run

from hintkv.sim.clock import EventClock


def _warm(eng, clock) -> None:
    """A on the device, then pushed to the host tier by D and F (as the one-instance test)."""
    for rid, prompt in (("a", A), ("d", D), ("f", F)):
        _run(eng, clock, rid, prompt)
        _drain(clock)


def test_a_wait_nested_in_another_instances_wait_is_declined_and_counted(costs):
    clock = EventClock()
    (e1, _, steps1, _), (e2, _, steps2, _) = (_engine(costs, "same-step", clock) for _ in "12")
    _warm(e1, clock)
    _warm(e2, clock)
    b_prompt = A + list(range(300_000, 300_000 + BS))  # A's prefix, all of it on the host tier
    load_s = 64 * e1.kv.tiers.stack.mover.transfer_s("host->device", 1, idle=False)
    first1, first2, t0 = len(steps1), len(steps2), clock()
    assert clock.num_waits == 0 and clock.nested_waits_declined == 0
    _run(e1, clock, "c", C)
    b1 = _run(e1, clock, "b", b_prompt)
    b2 = []

    def second():  # instance 2's calls arrive while instance 1's step waits for its load
        _run(e2, clock, "c", C)
        b2.append(_run(e2, clock, "b", b_prompt))
    clock.at(t0 + load_s / 2, second)
    _drain(clock)
    ids1, started1, _ = steps1[first1]
    assert ids1 == ["c", "b"]  # instance 1 waited and computed b in the step its load started
    assert started1 < t0 + load_s / 2 + load_s  # resumed at its own landing, not at instance 2's
    assert e1.kv.tiers.counters.load_wait_s == started1 - t0
    ids2, started2, scheduled2 = steps2[first2]
    assert t0 < scheduled2 < started1  # instance 2's step ran inside instance 1's wait,
    assert ids2 == ["c"] and started2 == scheduled2  # did not wait: b computes one step later
    assert "b" in steps2[first2 + 1][0] and e2.kv.tiers.counters.num_loaded == 64
    assert e2.kv.tiers.counters.load_wait_s == 0
    assert clock.nested_waits_declined == 1 and clock.num_waits >= 1
    assert b1["first"] < b2[0]["first"]
