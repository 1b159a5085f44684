"""The TTFT bound (`sim.bound`): a call's own prefill alone, in budget-sized chunks, at given hits.
Checked against the real simulated runs: no call's TTFT is below its own prefill alone at its own
hits, and no run's mean TTFT is below the compulsory-miss bound."""

from __future__ import annotations

import pytest

from hintkv.replay import belady
from hintkv.sim.bound import mean_prefill_alone_s, prefill_alone_s, ttft_bound_s
from hintkv.sim.simulate import CONFIGS, HOST_FACTOR, simulate
from hintkv.sim.workload import build_workload

BUDGET = 512  # small, so the slice's prompts take several chunks each


def test_prefill_alone_is_its_chunks_each_alone(costs):
    assert prefill_alone_s(costs, 1000, 0, 8192) == pytest.approx(costs.step_ms([(1000, 0)]) / 1e3)
    # 1000 tokens on 600 cached, budget 256: chunks of 256 and 144, each attending to what is before it
    want = costs.step_ms([(256, 600)]) + costs.step_ms([(144, 856)])
    assert prefill_alone_s(costs, 1000, 600, 256) == pytest.approx(want / 1e3)
    # a prompt wholly cached still computes its last token
    assert prefill_alone_s(costs, 1000, 1000, 256) == pytest.approx(costs.step_ms([(1, 999)]) / 1e3)
    # fewer hits never cost less
    assert prefill_alone_s(costs, 5000, 0, 256) > prefill_alone_s(costs, 5000, 4000, 256) > 0


@pytest.fixture(scope="module")
def runs(traces, costs):
    wl = build_workload([traces], users=3, seed=1, token_scale=0.05, max_calls=6, max_tasks=6, stagger_s=5.0)
    device = 6000
    out = {n: simulate(wl, CONFIGS[n], costs, device_tokens=device, max_num_batched_tokens=BUDGET)
           for n in ("lru", "lru+host", "sam+hints+host")}
    return out, device // 16


def test_no_call_is_faster_than_its_own_prefill_alone(runs, costs):
    out, _ = runs
    for name, r in out.items():
        assert any(c.prompt_tokens - c.cached_tokens > BUDGET for c in r.calls), name  # chunks happen
        for c in r.calls:
            alone = prefill_alone_s(costs, c.prompt_tokens, c.cached_tokens, BUDGET)
            assert c.ttft_s >= alone - 1e-9, (name, c.session_id, c.index)
        assert r.mean_ttft_s >= mean_prefill_alone_s(costs, r.calls, BUDGET) - 1e-9


def test_no_run_beats_the_compulsory_bound_and_the_oracle_bound_sits_above_it(runs, costs):
    out, blocks = runs
    for name, r in out.items():
        compulsory = ttft_bound_s(costs, r.accesses, None, 16, BUDGET)
        at_oracle = ttft_bound_s(costs, r.accesses, blocks * (1 + HOST_FACTOR), 16, BUDGET)
        at_device = ttft_bound_s(costs, r.accesses, blocks, 16, BUDGET)
        assert 0 < compulsory <= at_oracle <= at_device, name
        assert r.mean_ttft_s >= compulsory, name
    # the per-access hits are the oracle's hits, access by access
    acc = out["lru"].accesses
    res = belady(acc, blocks, 16)
    assert len(res.access_hit_tokens) == len(acc) and sum(res.access_hit_tokens) == res.hit_tokens
    assert any(h > 0 for h in res.access_hit_tokens)
