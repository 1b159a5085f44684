"""Many simulated instances behind the router's placement code with the shared pool: every call is
served once, a session stays on its instance, no run hits more than the oracle over the cluster's
whole capacity, the pool holds only checked frames, and the same seed gives the same report."""

from __future__ import annotations

from collections import defaultdict

import pytest

from hintkv.replay import belady
from hintkv.sim.simulate import CONFIGS, HOST_FACTOR, POOL_FACTOR, num_host_blocks, simulate
from hintkv.sim.tiers import real_block_bytes
from hintkv.sim.workload import build_workload

INSTANCES = 3


def _workload(traces: str):
    # 6 users over 3 instances, traces reused under fresh salts: 10 distinct tasks
    return build_workload([traces], users=6, seed=2, token_scale=0.05, max_calls=6, max_tasks=10,
                          stagger_s=5.0)


def _room(wl) -> int:
    """A device pool that holds the longest call, and little more: the instances are under pressure."""
    return max(c.num_prompt_tokens + c.max_tokens for t in wl.tasks() for a in t.agents()
               for c in a.calls) + 64


@pytest.fixture(scope="module")
def runs(traces, costs):
    wl = _workload(traces)
    room = _room(wl)
    out = {name: simulate(wl, CONFIGS[name], costs, room, instances=INSTANCES)
           for name in ("lru", "lru+pool", "sam+hints+pool", "sam+hints+pool+wt")}
    return wl, room, out


def test_every_call_served_once_and_sessions_stay_put(runs):
    wl, _, out = runs
    for name, r in out.items():
        keys = [(c.task_id, c.session_id, c.index) for c in r.calls]
        assert len(keys) == wl.num_calls == len(set(keys)), name
        assert all(c.ttft_s is not None and c.e2e_s >= c.ttft_s for c in r.calls)
        where = defaultdict(set)
        for c in r.calls:
            where[c.session_id].add(c.instance)
        assert all(len(v) == 1 for v in where.values()), f"{name}: a session moved"
        assert r.router["moved"] == 0
        assert len({c.instance for c in r.calls}) == INSTANCES, f"{name}: an instance got nothing"
        sends = r.router["affinity"] + r.router["parent"] + r.router["least_loaded"]
        assert sends >= wl.num_calls  # management requests are placed too (hints on)
        if not CONFIGS[name].hints:
            assert sends == wl.num_calls


def test_sub_agents_land_next_to_their_parent(runs):
    wl, _, out = runs
    r = out["sam+hints+pool"]
    assert r.router["parent"] > 0  # the workload has sub-agents, the instances have room
    first = {}
    for c in sorted(r.calls, key=lambda c: c.sent_s):
        first.setdefault(c.session_id, c.instance)
    parents = {sp.agent.session_id: a.session_id for t in wl.tasks() for a in t.agents()
               for c in a.calls for sp in c.spawns}
    placed = [(sid, p) for sid, p in parents.items() if p and p != sid and p in first and sid in first]
    assert placed and sum(first[s] == first[p] for s, p in placed) == r.router["parent"]


def test_no_run_hits_more_than_the_oracle_over_the_whole_cluster(runs):
    _, room, out = runs
    blocks = room // 16
    o = belady(out["lru"].accesses, blocks * INSTANCES, 16).hit_rate
    o_pool = belady(out["lru"].accesses, blocks * INSTANCES * (1 + HOST_FACTOR + POOL_FACTOR), 16).hit_rate
    assert out["lru"].hit_rate <= o + 1e-9
    assert out["lru+pool"].hit_rate <= o_pool + 1e-9
    assert out["sam+hints+pool"].hit_rate <= o_pool + 1e-9
    assert out["sam+hints+pool+wt"].hit_rate <= o_pool + 1e-9


def test_the_pool_follows_sessions_only_with_spm(runs):
    """SPM's publish, keep-alive and release (with write-through: this small workload never
    fills the host tier, so by default nothing reaches the pool)."""
    _, _, out = runs
    spm, plain = out["sam+hints+pool+wt"].pool_stats, out["lru+pool"].pool_stats
    assert spm["puts"] > 0 and spm["keepalive_calls"] > 0 and spm["released"] > 0
    assert plain["released"] == 0 and plain["keepalive_calls"] == 0  # a plain store
    assert out["sam+hints+pool+wt"].peak_pool_bytes > 0
    assert out["sam+hints+pool+wt"].bytes_moved.get("host->pool", 0) > 0


def test_by_default_the_pool_gets_only_what_the_host_evicts(runs):
    _, _, out = runs
    wt, no_wt = out["sam+hints+pool+wt"], out["sam+hints+pool"]
    assert not CONFIGS["sam+hints+pool"].pool_write_through and CONFIGS["sam+hints+pool+wt"].pool_write_through
    cascaded = no_wt.pool_stats["puts"] + no_wt.pool_stats["dedup"]
    assert cascaded < wt.pool_stats["puts"] + wt.pool_stats["dedup"]  # each finished request is not
    assert no_wt.peak_pool_bytes < wt.peak_pool_bytes
    assert no_wt.bytes_moved.get("host->pool", 0) < wt.bytes_moved.get("host->pool", 0)


def test_same_seed_same_cluster_report(runs, traces, costs):
    _, room, out = runs
    again = simulate(_workload(traces), CONFIGS["sam+hints+pool"], costs, room, instances=INSTANCES)
    a = out["sam+hints+pool"]
    fp = [(c.session_id, c.index, c.instance, round(c.sent_s, 9), round(c.e2e_s, 9), c.cached_tokens)
          for c in a.calls]
    assert fp == [(c.session_id, c.index, c.instance, round(c.sent_s, 9), round(c.e2e_s, 9),
                   c.cached_tokens) for c in again.calls]
    assert a.pool_stats == again.pool_stats and a.router == again.router


def test_a_small_host_tier_sends_its_evictions_to_the_pool(traces, costs):
    """`host_factor` sizes each host tier (`hintkv sim --host-factor`): at a quarter of the device
    the host evicts, and the pool gets puts and serves gets without write-through; no host holds
    more than its blocks; no run hits more than the oracle over the cluster's capacity."""
    wl = _workload(traces)
    room = _room(wl)
    blocks = room // 16
    host = num_host_blocks(0.25, blocks)
    assert host == blocks // 4 and num_host_blocks(1e-9, blocks) == 1
    for name in ("lru+pool", "sam+hints+pool"):
        r = simulate(wl, CONFIGS[name], costs, room, instances=INSTANCES, host_factor=0.25)
        assert r.host_tokens == host * 16, name
        assert r.peak_host_bytes <= INSTANCES * host * real_block_bytes(costs, 16), name
        assert r.pool_stats["puts"] > 0 and r.pool_stats["gets"] > 0, name
        assert r.hit_rate <= belady(r.accesses, INSTANCES * (blocks + host + POOL_FACTOR * blocks), 16).hit_rate + 1e-9
