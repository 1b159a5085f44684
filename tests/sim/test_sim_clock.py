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


def test_a_wait_inside_a_wait_ends_by_the_outer_ones_end():
    """Two instances on one clock: the second's wait, run by the first's, may not carry the clock
    past the time the first waits for (its step would start late)."""
    clock = EventClock()
    inner = []
    clock.at(1.0, lambda: inner.append(clock.wait_for(lambda: False, 5.0)))
    clock.at(1.5, lambda: inner.append("late"))
    assert not clock.wait_for(lambda: False, 2.0)
    assert inner == ["late", False] and clock() == 2.0  # (the inner wait ran the 1.5 event)
