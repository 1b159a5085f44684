"""`sim.contended`: the TTFT bound with the prefills that must overlap (shortest remaining work
first on one instance), hand-checked, against every non-preemptive order, and under a real run."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.sim.bound import prefill_alone_s
from hintkv.sim.contended import (cheapest_token_ms, contended_bound_s, contended_bounds, prefill_work_ms,
                                  srpt_flow_s)
from hintkv.sim.oracles import OracleBook
from hintkv.sim.simulate import CONFIGS, HOST_FACTOR, simulate
from hintkv.sim.workload import build_workload


def test_srpt_hand_checked():
    # both at 0: the short one first (1), the long one after it (3)
    assert srpt_flow_s([(0.0, 2.0), (0.0, 1.0)]) == [3.0, 1.0]
    # a shorter job released mid-way preempts: at 1 the first has 2 left, the second 1
    assert srpt_flow_s([(0.0, 3.0), (1.0, 1.0)]) == [4.0, 1.0]  # first-come: 3 and 3
    # idle until a release; a longer job released later waits for the shorter remainder
    assert srpt_flow_s([(5.0, 1.0), (0.0, 2.0), (1.0, 4.0)]) == [1.0, 2.0, 6.0]
    assert srpt_flow_s([]) == []


def _non_preemptive_total(jobs, order) -> float:
    now = total = 0.0
    for j in order:
        now = max(now, jobs[j][0]) + jobs[j][1]
        total += now - jobs[j][0]
    return total


@settings(max_examples=120, deadline=None)
@given(jobs=st.lists(st.tuples(st.integers(0, 6).map(float), st.integers(1, 5).map(float)), min_size=1,
                     max_size=5))
def test_srpt_is_no_worse_than_any_order(jobs):
    """No non-preemptive order (idling until each release) has a smaller total flow time; each
    job's flow is at least its own work."""
    flow = srpt_flow_s(jobs)
    assert all(f >= w - 1e-12 for f, (_, w) in zip(flow, jobs))
    best = min(_non_preemptive_total(jobs, p) for p in itertools.permutations(range(len(jobs))))
    assert sum(flow) <= best + 1e-9


def test_a_calls_work_is_at_most_its_prefill_alone(costs):
    budget = 8192
    rate = cheapest_token_ms(costs, budget)
    assert all(rate * n <= costs.cold_ms(n) + 1e-12 for n in range(1, budget + 1, 7))
    for prompt, cached in ((105_000, 98_000), (20_000, 0), (9000, 8999), (300, 64)):
        work = prefill_work_ms(costs, prompt, cached, budget, rate)
        assert 0 < work <= prefill_alone_s(costs, prompt, cached, budget) * 1e3 + 1e-9


@pytest.fixture(scope="module")
def runs(traces, costs):
    # 8 users at once with think times / 1000 and a 256-token budget: prefills overlap
    wl = build_workload([traces], users=8, seed=1, token_scale=0.05, max_calls=6, max_tasks=8, stagger_s=0.0)
    device, budget = 8192, 256
    book = OracleBook({"oracle+host": device // 16 * (1 + HOST_FACTOR)}, 16, costs, budget)
    res = {}
    for n in ("lru+host", "sam+hints+host"):
        res[n] = simulate(wl, CONFIGS[n], costs, device, max_num_batched_tokens=budget, time_scale=1000.0)
        book.take(n, res[n])
    return res, book, budget


def test_no_run_is_under_its_contended_compulsory_bound(runs, costs):
    """At compulsory misses every call's work is a floor whatever the policy, so no run's mean TTFT
    is below the bound on its own arrivals; the overlap shows (above the calls' work alone and
    above each call's prefill alone: the 256-token budget and the burst make prefills queue)."""
    res, book, budget = runs
    rate = cheapest_token_ms(costs, budget)
    for n, r in res.items():
        hits = book.own_compulsory[n]
        bound = contended_bound_s(costs, r.calls, hits, budget)
        work = sum(prefill_work_ms(costs, c.prompt_tokens, hits[c.access], budget, rate)
                   for c in r.calls) / 1e3 / len(r.calls)
        alone = sum(prefill_alone_s(costs, c.prompt_tokens, hits[c.access], budget) for c in r.calls) / len(r.calls)
        assert work < alone < bound <= r.mean_ttft_s, n


def test_the_report_takes_the_hinted_runs_arrivals(runs, costs):
    res, book, budget = runs
    got = contended_bounds(costs, res, book, budget)
    hinted = res["sam+hints+host"].calls
    assert got == {"contended_run": "sam+hints+host",
                   "contended_s": contended_bound_s(costs, hinted, book.own_hits["sam+hints+host"], budget),
                   "contended_compulsory_s": contended_bound_s(costs, hinted, book.own_compulsory["sam+hints+host"],
                                                               budget)}
    assert got["contended_s"] <= got["contended_compulsory_s"]  # more hits, less work
    assert contended_bounds(costs, {"lru+host": res["lru+host"]}, book, budget) == {}


def test_a_call_with_nothing_beside_it_is_bounded_by_its_prefill_alone(costs):
    """One call: its SRPT flow is its work (the cheapest rate, under its launch-bound chunk's cost),
    so the bound is its prefill alone, the larger floor."""
    call = SimpleNamespace(access=0, sent_s=3.0, prompt_tokens=300, instance=0)
    rate = cheapest_token_ms(costs, 8192)
    assert prefill_work_ms(costs, 300, 64, 8192, rate) < prefill_alone_s(costs, 300, 64, 8192) * 1e3
    assert contended_bound_s(costs, [call], [64], 8192) == prefill_alone_s(costs, 300, 64, 8192)
