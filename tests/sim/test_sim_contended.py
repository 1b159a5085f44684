"""`sim.contended`: the TTFT bound with the prefills that must overlap (shortest remaining work
first on one instance), hand-checked, against every non-preemptive order, and under a real run."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.sim.bound import prefill_alone_s
from hintkv.sim.contended import (attn_rate_ms, cheapest_token_ms, contended_bound_s, contended_bounds,
                                  least_attn_ms, prefill_work_ms, srpt_flow_s)
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


def test_the_bound_is_under_a_split_that_beats_the_prefill_alone(costs):
    """Hand-checked (the review that found the bound 1.8-4% over the floor): 8192 + 149 uncached
    tokens on 90,000 cached, alone on the instance. Budget-filling chunks cost 1819.0 ms, an even
    split 4171 + 4170 1750.9 ms; the old bound took the first as a floor (and priced the 149-token
    tail at its launch-bound attention rate). The work is under the even split."""
    budget, cached, prompt = 8192, 90_000, 90_000 + 8192 + 149
    greedy = costs.step_ms([(8192, cached)]) + costs.step_ms([(149, cached + 8192)])
    even = costs.step_ms([(4171, cached)]) + costs.step_ms([(4170, cached + 4171)])
    assert (round(greedy, 1), round(even, 1)) == (1819.0, 1750.9)
    assert prefill_alone_s(costs, prompt, cached, budget) * 1e3 == pytest.approx(greedy)
    rate = cheapest_token_ms(costs, budget)
    # by hand: 8341 tokens at 12.501 / 512 ms (the 512-token point's rate) plus every token's
    # attention at the 2048-token chunk's rate (the least), from 90,000 and from 98,192
    assert rate == pytest.approx(12.501 / 512)
    g = costs.attn_ms(2048, cached) / 2048, costs.attn_ms(2048, cached + 8192) / 2048
    assert attn_rate_ms(costs, cached, 8192) == pytest.approx(g[0])
    attn = 8192 * g[0] + 149 * g[1]
    assert least_attn_ms(costs, prompt, cached, budget) == pytest.approx(attn)
    work = prefill_work_ms(costs, prompt, cached, budget, rate)
    assert work == pytest.approx(8341 * rate + attn)
    assert work < even < greedy
    # the old tail price: 149 tokens at a 149-token chunk's own rate, 4x the least at this prefix
    assert costs.attn_ms(149, cached + 8192) > 3.5 * 149 * g[1]
    call = SimpleNamespace(access=0, sent_s=0.0, prompt_tokens=prompt, instance=0)
    assert contended_bound_s(costs, [call], [cached], budget) == pytest.approx(work / 1e3)


@pytest.mark.parametrize("cached,new,budget", [(0, 5000, 2048), (9000, 9000, 4096), (90_000, 8192 + 149, 8192),
                                               (30_000, 700, 8192), (200_000, 6000, 2048)])
def test_no_chunking_pays_less_attention_than_the_bound(costs, cached, new, budget):
    """Every split of the uncached tokens into chunks of at most the budget on a 64-token grid (the
    least by dynamic programming) pays at least `least_attn_ms`."""
    grid = 64
    units, most = -(-new // grid), budget // grid
    size = [min(grid * k, new) for k in range(units + 1)]  # tokens done after k units (the last may be short)
    best = [0.0] + [float("inf")] * units
    for k in range(1, units + 1):
        best[k] = min(best[j] + costs.attn_ms(size[k] - size[j], cached + size[j]) for j in range(max(0, k - most), k))
    assert least_attn_ms(costs, cached + new, cached, budget) <= best[units] + 1e-9


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


def test_a_call_with_nothing_beside_it_is_bounded_by_its_work(costs):
    """One call: its SRPT flow is its work (the cheapest rate, under its launch-bound chunk's cost)."""
    call = SimpleNamespace(access=0, sent_s=3.0, prompt_tokens=300, instance=0)
    rate = cheapest_token_ms(costs, 8192)
    work = prefill_work_ms(costs, 300, 64, 8192, rate)
    assert work < prefill_alone_s(costs, 300, 64, 8192) * 1e3
    assert contended_bound_s(costs, [call], [64], 8192) == pytest.approx(work / 1e3)
