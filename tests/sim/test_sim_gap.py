"""`sim.gap`: each call's TTFT over its own bound, split into parts that sum to it, against the bound
on the run's own access order."""

from __future__ import annotations

import pytest

from hintkv.replay import belady
from hintkv.sim.bound import bound_at_hits_s, prefill_alone_s
from hintkv.sim.gap import PARTS, gap_rows, worst_calls
from hintkv.sim.oracles import OracleBook
from hintkv.sim.simulate import CONFIGS, HOST_FACTOR, simulate
from hintkv.sim.workload import build_workload

WAITS = ("queue_s", "load_s", "blocked_s")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_the_excess_over_the_bound_is_its_parts_and_the_bound_is_the_runs_own(traces, costs):
    # 8 users at once, think times / 1000 and a 256-token budget: the calls queue, finish out of
    # send order, and the two runs send in different orders (different Belady hits per access)
    wl = build_workload([traces], users=8, seed=1, token_scale=0.05, max_calls=6, max_tasks=8, stagger_s=0.0)
    device, budget = 8192, 256
    cap = device // 16 * (1 + HOST_FACTOR)
    runs = {n: simulate(wl, CONFIGS[n], costs, device, max_num_batched_tokens=budget, time_scale=1000.0)
            for n in ("lru", "sam+hints+host")}
    own = {n: belady(r.accesses, cap, 16).access_hit_tokens for n, r in runs.items()}
    mean_bound = {n: bound_at_hits_s(costs, r.accesses, own[n], budget) for n, r in runs.items()}
    # the scenario: what the bound must follow is not given by any other order or mapping
    assert own["lru"] != own["sam+hints+host"]
    for n, r in runs.items():
        order = [c.access for c in r.calls]
        assert sorted(order) == list(range(len(own[n])))  # every access once
        assert any(own[n][i] != own[n][a] for i, a in enumerate(order))  # out of order where hits differ
    sam_waits = [_mean([c.ttft_parts[k] for c in runs["sam+hints+host"].calls]) for k in WAITS]
    assert len(set(sam_waits)) == 3 and min(sam_waits) > 0  # each wait shows, each its own size

    book = OracleBook({"oracle+host": cap}, 16, costs, budget)
    for n, r in runs.items():
        book.take(n, r)
    assert book.own_hits == own
    rows = {row["run"]: row for row in gap_rows(costs, runs, book.own_hits, budget)}
    assert set(rows) == set(runs)
    for n, row in rows.items():
        calls = runs[n].calls
        bound = [prefill_alone_s(costs, c.prompt_tokens, own[n][c.access], budget) for c in calls]
        alone = [prefill_alone_s(costs, c.prompt_tokens, c.cached_tokens, budget) for c in calls]
        want = {"ttft_mean_s": _mean([c.ttft_s for c in calls]), "bound_s": _mean(bound),
                "hits_s": _mean([a - b for a, b in zip(alone, bound)]),
                "beside_s": _mean([c.ttft_parts["compute_s"] + c.ttft_parts["shared_s"] - a
                                   for c, a in zip(calls, alone)]),
                **{k: _mean([c.ttft_parts[k] for c in calls]) for k in WAITS}}
        for k, v in want.items():
            assert row[k] == pytest.approx(v, rel=1e-9, abs=1e-12), (n, k)
        assert row["bound_s"] == pytest.approx(mean_bound[n], rel=1e-12)  # its own order, not the best one's
        assert row["excess_s"] == pytest.approx(row["ttft_mean_s"] - row["bound_s"], abs=1e-12)
        assert sum(row[k] for k in PARTS) == pytest.approx(row["excess_s"], abs=1e-9)
        assert 0 <= row["top10_share"] <= 1 and row["over_1s"] >= 0
    assert rows["lru"]["hits_s"] > 0  # the device-only run misses hits the host capacity gives

    worst = worst_calls(costs, runs, book.own_hits, budget, 3)
    assert worst_calls(costs, runs, book.own_hits, budget, 0) == []  # off by default
    for n, r in runs.items():
        mine = [w for w in worst if w["run"] == n]
        excess = sorted((c.ttft_s - prefill_alone_s(costs, c.prompt_tokens, own[n][c.access], budget)
                         for c in r.calls), reverse=True)
        assert [w["excess_s"] for w in mine] == pytest.approx(excess[:3], abs=1e-12)  # the worst, worst first
        for w in mine:
            call = next(c for c in r.calls if (c.session_id, c.index) == (w["session"], w["call"]))
            assert w["ttft_s"] == call.ttft_s and w["uncached"] == call.prompt_tokens - call.cached_tokens
            assert sum(w[k] for k in PARTS) == pytest.approx(w["excess_s"], abs=1e-9)
