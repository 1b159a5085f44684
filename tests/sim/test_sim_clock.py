"""The event clock runs events in time order, ties in scheduling order, and never goes back."""

from __future__ import annotations

import pytest

from hintkv.sim.clock import EventClock


def test_events_run_in_time_then_insertion_order():
    clock = EventClock()
    seen = []
    clock.at(2.0, lambda: seen.append(("b", clock())))
    clock.at(1.0, lambda: seen.append(("a", clock())))
    clock.at(2.0, lambda: seen.append(("c", clock())))
    clock.at(1.0, lambda: clock.after(0.5, lambda: seen.append(("d", clock()))))
    while clock.run_next():
        pass
    assert seen == [("a", 1.0), ("d", 1.5), ("b", 2.0), ("c", 2.0)]
    assert clock.num_events == 5 and len(clock) == 0


def test_run_until_and_no_past():
    clock = EventClock(10.0)
    hits = []
    clock.after(1.0, lambda: hits.append(clock()))
    clock.after(5.0, lambda: hits.append(clock()))
    clock.run_until(12.0)
    assert hits == [11.0] and clock() == 12.0 and clock.next_time() == 15.0
    with pytest.raises(ValueError, match="past"):
        clock.at(11.0, lambda: None)


def test_wait_for_runs_events_until_done_or_the_end():
    clock = EventClock()
    box = []
    clock.at(1.0, lambda: box.append("a"))
    clock.at(2.0, lambda: box.append("b"))
    clock.at(3.0, lambda: box.append("c"))
    assert clock.wait_for(lambda: "b" in box, 10.0)  # done by the 2.0 event: stands there
    assert box == ["a", "b"] and clock() == 2.0
    assert not clock.wait_for(lambda: "z" in box, 2.5)  # not done: waited the whole time
    assert box == ["a", "b"] and clock() == 2.5 and clock.next_time() == 3.0


def test_a_wait_inside_another_does_not_wait_and_the_outer_resumes_at_its_landing():
    """Two instances on one clock. B's step runs inside A's wait (its event falls in A's wait) and
    B's load has not landed: B does not wait (next-step timing for that step: False at once,
    counted), so A resumes exactly when its own load lands, not when B's does (it did: 3.0)."""
    clock = EventClock()
    a_landed, b_landed, inner = [], [], []
    clock.at(1.0, lambda: a_landed.append(clock()))
    clock.at(3.0, lambda: b_landed.append(clock()))
    clock.at(0.5, lambda: inner.append((clock.wait_for(lambda: bool(b_landed), 10.0), clock())))
    assert clock.wait_for(lambda: bool(a_landed), 5.0)
    assert clock() == 1.0 and inner == [(False, 0.5)]
    assert clock.num_waits == 1 and clock.nested_waits_declined == 1
    assert clock.next_time() == 3.0  # B's load still lands (a later step of B takes it)


def test_an_outer_wait_that_times_out_stands_at_its_own_limit():
    """A's load never lands within its limit 5.0; B's step inside it asks to wait until 10.5 for a
    load landing at 6.0: B is declined at once, A stands at 5.0, and B's landing at 6.0 is still
    to come (it was run inside A's wait and cut short there: (False, 5.0))."""
    clock = EventClock()
    b_landed, inner = [], []
    clock.at(6.0, lambda: b_landed.append(clock()))
    clock.at(2.0, lambda: inner.append((clock.wait_for(lambda: bool(b_landed), 10.5), clock())))
    assert not clock.wait_for(lambda: False, 5.0)
    assert clock() == 5.0 and inner == [(False, 2.0)] and clock.next_time() == 6.0
    assert clock.nested_waits_declined == 1
    assert clock.wait_for(lambda: bool(b_landed), 10.5) and clock() == 6.0  # a wait of its own: exact
    assert (clock.num_waits, clock.nested_waits_declined) == (2, 1)


def test_a_wait_whose_load_has_landed_neither_waits_nor_counts():
    clock = EventClock()
    clock.at(1.0, lambda: inner.append(clock.wait_for(lambda: True, 4.0)))
    inner = []
    assert not clock.wait_for(lambda: False, 2.0)
    assert inner == [True] and clock() == 2.0
    assert (clock.num_waits, clock.nested_waits_declined) == (1, 0)
