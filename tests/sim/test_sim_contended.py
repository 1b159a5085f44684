"""`sim.contended`: the TTFT bound with the prefills that must overlap (shortest remaining work
first on one instance), hand-checked, against every non-preemptive order, and under a real run."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.sim.bound import prefill_alone_s
from hintkv.sim.contended import (alone_srpt_s, busy_periods, chunk_floors_ms, contended_bound_s, contended_bounds,
                                  least_alone_ms, least_attn_ms, prefill_work_ms, srpt_flow_s)
from hintkv.sim.costs import CostModel
from hintkv.sim.oracles import OracleBook
from hintkv.sim.profile import load_profile
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
    rate = costs.least_cold_rate_ms(budget)
    assert all(rate * n <= costs.cold_ms(n) + 1e-12 for n in range(1, budget + 1, 7))
    for prompt, cached in ((105_000, 98_000), (20_000, 0), (9000, 8999), (300, 64)):
        work = prefill_work_ms(costs, prompt, cached, budget, rate)
        assert 0 < work <= prefill_alone_s(costs, prompt, cached, budget) * 1e3 + 1e-9


def test_the_bound_is_under_a_split_that_beats_the_prefill_alone(costs):
    """Hand-checked (the review that found the bound 1.8-4% over the floor): 8192 + 149 uncached
    tokens on 90,000 cached, alone on the instance. Budget-filling chunks cost 1819.0 ms, an even
    split 4171 + 4170 1750.9 ms; the old bound took the first as a floor (and priced the 149-token
    tail at its launch-bound attention rate). The floor is the cheapest chunking's cost, under the
    even split; the work (the cheapest batched rate) under that."""
    budget, cached, prompt = 8192, 90_000, 90_000 + 8192 + 149
    greedy = costs.step_ms([(8192, cached)]) + costs.step_ms([(149, cached + 8192)])
    even = costs.step_ms([(4171, cached)]) + costs.step_ms([(4170, cached + 4171)])
    assert (round(greedy, 1), round(even, 1)) == (1819.0, 1750.9)
    assert prefill_alone_s(costs, prompt, cached, budget) * 1e3 == pytest.approx(greedy)
    rate = costs.least_cold_rate_ms(budget)
    # by hand: 8341 tokens at 12.501 / 512 ms (the 512-token point's rate) plus every token's
    # attention at the 2048-token chunk's rate (the least), from 90,000 and from 98,192
    assert rate == pytest.approx(12.501 / 512)
    g = costs.attn_ms(2048, cached) / 2048, costs.attn_ms(2048, cached + 8192) / 2048
    assert costs.least_attn_rate_ms(cached, 8192) == pytest.approx(g[0])
    attn = 8192 * g[0] + 149 * g[1]
    assert least_attn_ms(costs, prompt, cached, budget) == pytest.approx(attn)
    work = prefill_work_ms(costs, prompt, cached, budget, rate)
    assert work == pytest.approx(8341 * rate + attn)
    # the 149-token tail priced at its own chunk's rate would pay 4x the least at this prefix
    assert costs.attn_ms(149, cached + 8192) > 3.5 * 149 * g[1]
    # alone, the cheapest chunking's cold compute is 16 even chunks near 512 tokens (the size with
    # the least cold rate); with the least attention that is the call's floor, above the work
    floor = least_alone_ms(costs, prompt, cached, budget)
    assert floor == pytest.approx(5 * costs.cold_ms(522) + 11 * costs.cold_ms(521) + attn)
    assert floor - attn < costs.cold_ms(557) + 14 * costs.cold_ms(556)  # 15 chunks
    assert floor - attn < 11 * costs.cold_ms(491) + 6 * costs.cold_ms(490)  # 17 chunks
    assert work < floor < even < greedy
    # the chunk floors price the attention at the chunk sizes the cold part is priced at: above
    # both older floors, under the even split
    alone, shared = chunk_floors_ms(costs, prompt, cached, budget)
    assert floor < alone < even and work < shared <= alone
    call = SimpleNamespace(access=0, sent_s=0.0, prompt_tokens=prompt, instance=0)
    assert contended_bound_s(costs, [call], [cached], budget) == pytest.approx(alone / 1e3)


PROFILES = ("h200-llama3-8b", "h200-llama3-70b")


@pytest.fixture(scope="module", params=PROFILES)
def h200(request) -> CostModel:
    return CostModel(load_profile(request.param))


def _least_chunking(f, cached: int, new: int, budget: int, grid: int) -> float:
    """The least sum of f(n, start) over every split of `new` tokens after `cached` into chunks
    of at most `budget`, boundaries on a `grid`-token grid (the last chunk may be short)."""
    units, most = -(-new // grid), budget // grid
    size = [min(grid * k, new) for k in range(units + 1)]  # tokens done after k units
    best = [0.0] + [float("inf")] * units
    for k in range(1, units + 1):
        best[k] = min(best[j] + f(size[k] - size[j], cached + size[j]) for j in range(max(0, k - most), k))
    return best[units]


def test_cold_is_convex_from_one_token(h200):
    """`least_alone_ms`'s even split and its stop rule need it: flat below the first measured
    size, then slopes that never fall."""
    xs, ys = h200._cold_x, h200._cold_y
    slopes = [0.0] + [(y1 - y0) / (x1 - x0) for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:])]
    assert all(a <= b + 1e-12 for a, b in zip(slopes, slopes[1:]))


# the first four cross the rate's upward bend at 8192 or 32768 cached with a short chunk: a short
# chunk first pays less there than budget-sized chunks from the start (the review's (4000, 12000))
@pytest.mark.parametrize("cached,new,budget", [(4000, 12000, 8192), (7000, 3000, 2048), (30_000, 5000, 4096),
                                               (28_000, 12_000, 8192), (0, 5000, 2048), (9000, 9000, 4096),
                                               (90_000, 8192 + 149, 8192), (30_000, 700, 8192),
                                               (200_000, 6000, 2048)])
def test_no_chunking_pays_less_attention_than_the_bound(h200, cached, new, budget):
    """Every split into chunks of at most the budget on a 64-token grid pays at least
    `least_attn_ms`, and every split alone costs at least `least_alone_ms`."""
    assert least_attn_ms(h200, cached + new, cached, budget) <= _least_chunking(
        h200.attn_ms, cached, new, budget, 64) + 1e-9
    assert least_alone_ms(h200, cached + new, cached, budget) <= _least_chunking(
        lambda n, c: h200.step_ms([(n, c)]), cached, new, budget, 64) + 1e-9


@settings(max_examples=25, deadline=None)
@given(cached=st.integers(0, 160).map(lambda u: 256 * u), new=st.integers(1, 20_000),
       budget=st.integers(1, 32).map(lambda u: 256 * u))
def test_drawn_chunkings_pay_at_least_the_bounds(h200, cached, new, budget):
    """As above, drawn (cached, new, budget) on a 256-token grid (odd budgets too: the bends at
    8192 and 32768 need not fall on a chunk boundary)."""
    assert least_attn_ms(h200, cached + new, cached, budget) <= _least_chunking(
        h200.attn_ms, cached, new, budget, 256) + 1e-9
    assert least_alone_ms(h200, cached + new, cached, budget) <= _least_chunking(
        lambda n, c: h200.step_ms([(n, c)]), cached, new, budget, 256) + 1e-9


def test_a_tokens_attention_never_costs_more_in_a_larger_chunk(h200):
    """`chunk_floors_ms` prices every chunk of at most m tokens at the m-token chunk's attention a
    token: it needs attn(n, s) / n not to rise with n, at every prefix."""
    sizes = sorted({1, 2, 64, 127, 128, 129, 300, 511, 512, 513, 1000, 2047, 2048, 2049, 4096, 8192, 32768})
    for s in (1, 500, 2047, 2048, 5000, 8192, 20_000, 32_768, 60_000, 100_000, 300_000, 700_000):
        rates = [h200.attn_ms(n, s) / n for n in sizes]
        assert all(a >= b - 1e-12 for a, b in zip(rates, rates[1:])), s


def _work_ms(costs: CostModel, budget: int):
    """A chunk's least share of a batched step (`chunk_floors_ms`' work)."""
    return lambda n, c: n * costs.least_cold_rate_ms(budget, n) + costs.attn_ms(n, c)


@pytest.mark.parametrize("cached,new,budget", [(4000, 12000, 8192), (7000, 3000, 2048), (30_000, 5000, 4096),
                                               (28_000, 12_000, 8192), (0, 5000, 2048), (9000, 9000, 4096),
                                               (90_000, 8192 + 149, 8192), (30_000, 700, 8192),
                                               (200_000, 6000, 2048), (0, 40_000, 8192), (1000, 30_000, 8192),
                                               (100_000, 300, 8192), (150_000, 20_000, 8192)])
def test_no_chunking_costs_less_than_the_chunk_floors(h200, cached, new, budget):
    """Every split into chunks of at most the budget on a 64-token grid costs at least
    `chunk_floors_ms`' alone floor alone, and takes at least its work floor of batched steps; both
    floors are at least the older ones (and the cold first prompts, the review's case, above them)."""
    alone, work = chunk_floors_ms(h200, cached + new, cached, budget)
    assert alone <= _least_chunking(lambda n, c: h200.step_ms([(n, c)]), cached, new, budget, 64) + 1e-9
    assert work <= _least_chunking(_work_ms(h200, budget), cached, new, budget, 64) + 1e-9
    assert least_alone_ms(h200, cached + new, cached, budget) <= alone
    assert prefill_work_ms(h200, cached + new, cached, budget, h200.least_cold_rate_ms(budget)) <= work <= alone


@settings(max_examples=25, deadline=None)
@given(cached=st.integers(0, 160).map(lambda u: 256 * u), new=st.integers(1, 20_000),
       budget=st.integers(1, 32).map(lambda u: 256 * u))
def test_drawn_chunkings_cost_at_least_the_chunk_floors(h200, cached, new, budget):
    alone, work = chunk_floors_ms(h200, cached + new, cached, budget)
    assert alone <= _least_chunking(lambda n, c: h200.step_ms([(n, c)]), cached, new, budget, 256) + 1e-9
    assert work <= _least_chunking(_work_ms(h200, budget), cached, new, budget, 256) + 1e-9


def test_busy_periods_split_where_the_server_would_idle():
    jobs = [(0.0, 1.0, 0), (0.5, 1.0, 0), (1.9, 0.5, 0), (2.5, 1.0, 0), (10.0, 1.0, 0)]  # 2.0, 2.5: done
    assert busy_periods(jobs) == [jobs[:3], jobs[3:4], jobs[4:]]
    assert busy_periods([]) == []


def test_the_bound_takes_the_larger_part_per_busy_period(costs):
    """Five 200-token cold calls sent together: SRPT over their batched work (4.88 ms each, the
    least cold rate) is above their floors alone (9.0 ms each) and under one step with all five;
    a lone call 100 s later adds its floor alone, not its work (the old bound took the larger of
    the two means over all calls)."""
    burst = [_call(0.0, 200, i) for i in range(5)]
    alone, work = chunk_floors_ms(costs, 200, 0, 8192)
    assert work == pytest.approx(200 * costs.least_cold_rate_ms(8192)) and alone == pytest.approx(costs.cold_ms(200))
    srpt = work * (1 + 2 + 3 + 4 + 5)
    assert 5 * alone < srpt < 5 * costs.step_ms([(200, 0)] * 5)
    assert contended_bound_s(costs, burst, [0] * 5, 8192) == pytest.approx(srpt / 5 / 1e3)
    both = contended_bound_s(costs, [*burst, _call(100.0, 200, 5)], [0] * 6, 8192)
    assert both == pytest.approx((srpt + alone) / 6 / 1e3)
    assert both > max(srpt + work, 6 * alone) / 6 / 1e3


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
    rate = costs.least_cold_rate_ms(budget)
    for n, r in res.items():
        hits = book.own_compulsory[n]
        bound = contended_bound_s(costs, r.calls, hits, budget)
        work = sum(prefill_work_ms(costs, c.prompt_tokens, hits[c.access], budget, rate)
                   for c in r.calls) / 1e3 / len(r.calls)
        alone = sum(prefill_alone_s(costs, c.prompt_tokens, hits[c.access], budget) for c in r.calls) / len(r.calls)
        assert work < alone < bound <= r.mean_ttft_s, n
        for c in r.calls:  # and each call's first token comes after its floor alone
            assert chunk_floors_ms(costs, c.prompt_tokens, hits[c.access], budget)[0] / 1e3 <= c.ttft_s + 1e-9, n


def test_the_report_takes_the_hinted_runs_arrivals(runs, costs):
    res, book, budget = runs
    got = contended_bounds(costs, res, book, budget)
    hinted = res["sam+hints+host"].calls
    assert got == {"contended_run": "sam+hints+host", "contended_none_why": None,
                   "contended_s": contended_bound_s(costs, hinted, book.own_hits["sam+hints+host"], budget),
                   "contended_compulsory_s": contended_bound_s(costs, hinted, book.own_compulsory["sam+hints+host"],
                                                               budget),
                   "alone_srpt_s": alone_srpt_s(costs, hinted, book.own_hits["sam+hints+host"], budget),
                   "bound_over_arrivals": {n: contended_bound_s(costs, r.calls, book.own_compulsory[n], budget)
                                           for n, r in res.items()}}
    assert len(got["bound_over_arrivals"]) == len(res) > 1  # every run's own arrivals, none under its own
    assert all(got["bound_over_arrivals"][n] <= r.mean_ttft_s for n, r in res.items())
    assert got["contended_s"] <= got["contended_compulsory_s"]  # more hits, less work
    assert contended_bounds(costs, {"lru+host": res["lru+host"]}, book, budget) == {}


def test_a_call_with_nothing_beside_it_is_bounded_by_its_prefill_alone(costs):
    """One call: its SRPT flow is its work (the cheapest batched rate), under the floor of its
    cheapest chunking alone; 236 uncached tokens have one chunking worth taking (two chunks pay
    the flat launch-bound cold cost twice), so the bound is its prefill alone."""
    call = SimpleNamespace(access=0, sent_s=3.0, prompt_tokens=300, instance=0)
    work = prefill_work_ms(costs, 300, 64, 8192, costs.least_cold_rate_ms(8192))
    alone = prefill_alone_s(costs, 300, 64, 8192)
    assert work < alone * 1e3 and 2 * costs.cold_ms(118) > costs.cold_ms(236)
    assert least_alone_ms(costs, 300, 64, 8192) == pytest.approx(alone * 1e3)
    assert contended_bound_s(costs, [call], [64], 8192) == pytest.approx(alone)


def _call(sent_s: float, prompt_tokens: int, access: int) -> SimpleNamespace:
    return SimpleNamespace(access=access, sent_s=sent_s, prompt_tokens=prompt_tokens, instance=0)


def test_srpt_over_each_calls_prefill_alone_hand_checked(costs):
    """A 16,384-token cold call at 0 s (two full chunks alone: a), a 300-token one at 0.1 s (b < a -
    0.1): the short one preempts, so the flows are b and a + b."""
    a, b = prefill_alone_s(costs, 16_384, 0, 8192), prefill_alone_s(costs, 300, 0, 8192)
    assert b < a - 0.1
    assert a == pytest.approx(2 * costs.cold_ms(8192) / 1e3 + costs.attn_ms(8192, 8192) / 1e3)
    got = alone_srpt_s(costs, [_call(0.0, 16_384, 0), _call(0.1, 300, 1)], [0, 0], 8192)
    assert got == pytest.approx((a + b + b) / 2)
    assert alone_srpt_s(costs, [_call(0.0, 300, -1)], [], 8192) is None  # no access kept: no call


def test_srpt_over_the_prefills_alone_is_not_a_bound_but_the_contended_one_is(costs):
    """Two 200-token cold calls sent together: alone 9.0 ms each, so SRPT over that work gives 9.0
    and 18.0 ms (13.5 mean); one step with both costs cold(400) = 11.25 ms for both (`cold` is flat
    below 128 tokens and rises 11.2 us a token to 512: the launch-bound cost is paid once). The
    contended bound prices the tokens at the cheapest batched rate: under that schedule."""
    calls, hits = [_call(0.0, 200, 0), _call(0.0, 200, 1)], [0, 0]
    alone = prefill_alone_s(costs, 200, 0, 8192)
    batched = costs.step_ms([(200, 0), (200, 0)]) / 1e3
    assert alone == pytest.approx(0.0090016, abs=1e-6) and batched == pytest.approx(0.011245, abs=1e-5)
    assert alone_srpt_s(costs, calls, hits, 8192) == pytest.approx(1.5 * alone)
    assert contended_bound_s(costs, calls, hits, 8192) <= batched < 1.5 * alone


def test_the_contended_bound_is_under_every_run_and_the_alone_srpt_mean(runs, costs):
    """On the slice's own arrivals at the oracle+host's hits (the policies here reach them): no
    run's mean TTFT is below its contended bound, and that bound is below SRPT over the prefills
    alone (less work a call, and the mean of each call's cheapest chunking alone is under them)."""
    res, book, budget = runs
    for n, r in res.items():
        hits = book.own_hits[n]
        lower = contended_bound_s(costs, r.calls, hits, budget)
        assert lower <= alone_srpt_s(costs, r.calls, hits, budget) and lower <= r.mean_ttft_s, n
