"""Why `sim.contended`'s bound takes one run's arrivals (docs/benchmarks/sim.md, "The bound and the closed
loop"), by brute force over every schedule of tiny closed-loop workloads on one unit-rate server.

A session is a chain: its next call is sent `gap` after its previous call's first token (the decode and
the tool time). Time runs in unit slots; a schedule gives each slot to one sent, unfinished call or
idles; a call's flow (its TTFT) is its last slot's end less its send. Two claims:

- SRPT over the EARLIEST sends (every earlier call of a session at its work alone) is no floor: it
  lets a session's next call wait behind its own previous one, which no schedule does.
- A schedule that may hold a call's decode (send the session's next call later than `gap`, at no
  cost to any TTFT) serves every later call alone: the least total flow is SRPT over the sessions'
  first calls (the only sends no schedule moves) plus the later calls' work. So no bound that prices
  contention between calls holds for every schedule unless it fixes the arrivals.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import pytest

from hintkv.sim.contended import srpt_flow_s

Chain = tuple[int, tuple[tuple[int, int], ...]]  # (first send, ((work, gap before it), ...))


def least_total_flow(chains: tuple[Chain, ...], holds: bool) -> int:
    """The least total flow of any schedule (`holds`: a call's successor may be sent any time after
    its gap, up to a horizon past which nothing is left to gain)."""
    horizon = max(r for r, _ in chains) + sum(w + g for _, calls in chains for w, g in calls) + 2

    @lru_cache(maxsize=None)
    def go(t: int, state: tuple) -> float:  # state: per chain (call index, work left, its send)
        live = [i for i, (k, _, _) in enumerate(state) if k < len(chains[i][1])]
        if not live:
            return 0
        if t > horizon:
            return float("inf")
        best = go(t + 1, state)  # idle this slot
        for i in live:
            k, left, sent = state[i]
            if sent > t:
                continue
            if left > 1:
                best = min(best, go(t + 1, state[:i] + ((k, left - 1, sent),) + state[i + 1:]))
                continue
            calls, done = chains[i][1], t + 1 - sent
            if k + 1 == len(calls):
                best = min(best, done + go(t + 1, state[:i] + ((k + 1, 0, 0),) + state[i + 1:]))
                continue
            work, gap = calls[k + 1]
            for at in range(t + 1 + gap, (horizon if holds else t + 1 + gap) + 1):
                best = min(best, done + go(t + 1, state[:i] + ((k + 1, work, at),) + state[i + 1:]))
        return best

    return go(0, tuple((0, calls[0][0], r) for r, calls in chains))


def earliest_srpt_total(chains: tuple[Chain, ...]) -> float:
    """SRPT's total flow over the calls as independent jobs, each sent at its earliest time."""
    jobs = []
    for first, calls in chains:
        t = first
        for k, (work, gap) in enumerate(calls):
            t += gap if k else 0
            jobs.append((float(t), float(work)))
            t += work
    return sum(srpt_flow_s(jobs))


def test_srpt_over_the_earliest_sends_is_no_floor():
    # a: one call of 1 at 0; b: two calls of 1 at 0, the second sent at the first's end. SRPT over the
    # earliest sends (0, 0, 1) runs a, b1, then b2 (sent at 1, it "waits" 1 behind b1): 1 + 2 + 2 = 5;
    # a schedule runs a, b1, then b2 sent at 2 when b1 ends: 1 + 2 + 1 = 4.
    chains = ((0, ((1, 0),)), (0, ((1, 0), (1, 0))))
    assert earliest_srpt_total(chains) == 5.0
    assert least_total_flow(chains, holds=False) == 4


def test_srpt_over_the_earliest_sends_is_a_floor_for_independent_calls():
    """The sanity side: with one call a session (nothing closed-loop) it is the least total, as Schrage."""
    for sends in itertools.product(range(3), repeat=3):
        for works in itertools.product((1, 2, 3), repeat=3):
            chains = tuple((s, ((w, 0),)) for s, w in zip(sends, works))
            assert least_total_flow(chains, holds=False) == earliest_srpt_total(chains), chains


@pytest.mark.parametrize("chains", [
    ((0, ((2, 0), (3, 1))), (1, ((1, 0), (2, 0)))),
    ((0, ((1, 0), (2, 0), (1, 0))), (0, ((2, 0), (1, 1)))),
    ((0, ((3, 0), (1, 0))), (0, ((1, 0), (3, 0))), (1, ((1, 0),))),
])
def test_with_decode_holds_only_the_first_calls_contend(chains):
    firsts = sum(srpt_flow_s([(float(r), float(calls[0][0])) for r, calls in chains]))
    later = sum(w for _, calls in chains for w, _ in calls[1:])
    held = least_total_flow(chains, holds=True)
    assert held == firsts + later
    assert held < least_total_flow(chains, holds=False)  # in each of these, holding pays
