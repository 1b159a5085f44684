"""`sim.gap`: each call's TTFT over its own bound, split into parts that sum to it, against the bound
on the run's own access order."""

from __future__ import annotations

import pytest

from hintkv.replay import belady
from hintkv.sim.bound import bound_at_hits_s
from hintkv.sim.gap import PARTS, gap_rows
from hintkv.sim.oracles import OracleBook
from hintkv.sim.simulate import CONFIGS, HOST_FACTOR, simulate
from hintkv.sim.workload import build_workload


def test_the_excess_over_the_bound_is_its_parts_and_the_bound_is_the_runs_own(traces, costs):
    wl = build_workload([traces], users=3, seed=1, token_scale=0.05, max_calls=6, max_tasks=6, stagger_s=5.0)
    device, budget = 8192, 1024  # the capacity and the budget bind
    cap = device // 16 * (1 + HOST_FACTOR)
    runs = {n: simulate(wl, CONFIGS[n], costs, device, max_num_batched_tokens=budget)
            for n in ("lru", "sam+hints+host")}
    want = {}
    for n, r in runs.items():
        hits = belady(r.accesses, cap, 16).access_hit_tokens
        want[n] = bound_at_hits_s(costs, r.accesses, hits, budget)
    book = OracleBook({"oracle+host": cap}, 16, costs, budget)
    for n, r in runs.items():
        book.take(n, r)
    rows = {row["run"]: row for row in gap_rows(costs, runs, book.own_hits, budget)}
    assert set(rows) == set(runs)
    for n, row in rows.items():
        r = runs[n]
        assert row["ttft_mean_s"] == pytest.approx(r.mean_ttft_s, rel=1e-12)
        assert row["bound_s"] == pytest.approx(want[n], rel=1e-12)  # its own order, not the best one's
        assert row["excess_s"] == pytest.approx(row["ttft_mean_s"] - row["bound_s"], abs=1e-12)
        assert sum(row[k] for k in PARTS) == pytest.approx(row["excess_s"], abs=1e-9)
        assert 0 <= row["top10_share"] <= 1 and row["over_1s"] >= 0
    assert rows["lru"]["hits_s"] > 0  # the device-only run misses hits the host capacity gives
