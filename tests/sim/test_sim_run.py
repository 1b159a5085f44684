"""The simulator on a small slice of the real traces: deterministic, never above the oracle, and the
real cache stack stays consistent (every run ends with `check_integrity()` on the scheduler)."""

from __future__ import annotations

import gc
import json

import pytest

from hintkv.replay import belady
from hintkv.sim.agents import flatten
from hintkv.sim.bound import bound_at_hits_s
from hintkv.sim.run import ONE_INSTANCE_CONFIGS, resolve
from hintkv.sim.simulate import CONFIGS, HOST_FACTOR, no_cyclic_gc, simulate
from hintkv.sim.workload import build_workload


def _workload(traces: str):
    return build_workload([traces], users=3, seed=1, token_scale=0.05, max_calls=6, max_tasks=6,
                          stagger_s=5.0)


@pytest.fixture(scope="module")
def workload(traces):
    return _workload(traces)


def _fingerprint(res):
    return [(c.session_id, c.index, round(c.sent_s, 9), round(c.ttft_s, 9), round(c.e2e_s, 9),
             c.cached_tokens) for c in res.calls]


def test_same_seed_same_report(workload, traces, costs):
    a = simulate(workload, CONFIGS["sam+hints+host"], costs, device_tokens=_room(workload))
    b = simulate(_workload(traces), CONFIGS["sam+hints+host"], costs, device_tokens=_room(workload))
    assert _fingerprint(a) == _fingerprint(b)
    assert a.num_steps == b.num_steps and a.sim_s == b.sim_s
    assert len(a.calls) == workload.num_calls and len(a.tasks) == len(workload.tasks())
    assert a.num_edits["offload"] > 0 and a.num_edits["evict"] > 0  # hints were sent


def _room(workload) -> int:
    """A device pool that holds the longest call, and little more: the capacity binds."""
    return max(len(flatten(c.prompt)) + c.max_tokens for t in workload.tasks() for a in t.agents()
               for c in a.calls) + 64


def test_no_configuration_hits_more_than_the_oracle(workload, costs):
    device = _room(workload)
    lru = simulate(workload, CONFIGS["lru"], costs, device_tokens=device)
    blocks = device // 16
    oracle = belady(lru.accesses, blocks, 16)
    oracle_host = belady(lru.accesses, blocks * (1 + HOST_FACTOR), 16)
    ideal = belady(lru.accesses, None, 16)
    assert oracle.prompt_tokens == lru.prompt_tokens
    assert lru.hit_tokens <= oracle.hit_tokens <= oracle_host.hit_tokens <= ideal.hit_tokens
    assert oracle.hit_tokens < ideal.hit_tokens  # the capacity binds: the comparison means something
    for name, cfg in CONFIGS.items():
        res = lru if name == "lru" else simulate(workload, cfg, costs, device_tokens=device)
        bound = oracle_host if cfg.host else oracle
        assert res.hit_tokens <= bound.hit_tokens, name
        for c in res.calls:
            assert 0 <= c.cached_tokens < c.prompt_tokens
            assert 0 < c.ttft_s <= c.e2e_s
            assert sum(c.ttft_parts.values()) == pytest.approx(c.ttft_s, abs=1e-6)  # the parts are the whole
        # why the queue waited: its causes split exactly the calls' summed admission wait
        queued = sum(c.ttft_parts["queue_s"] for c in res.calls)
        assert sum(res.wait_s.values()) == pytest.approx(queued, rel=1e-6, abs=1e-6), name
        assert all(v >= 0 for v in res.wait_s.values())
        if cfg.host:
            assert res.peak_host_bytes > 0 and res.bytes_moved.get("device->host", 0) > 0, name


def test_sim_command_prints_table_then_goals_json(traces, capsys):
    from hintkv.cli import main

    assert main(["sim", "--profile", "h200-llama3-8b", "--users", "2", "--traces", traces,
                 "--token-scale", "0.05", "--max-calls", "3", "--max-tasks", "2", "--no-progress",
                 "--device-tokens", "20000"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[1].startswith("config")
    last = json.loads(out[-1])
    sched = last["scheduling"]
    assert sched == "srpt-swap"  # the hinted runs' scheduler; lru runs keep fcfs, plus lru under it
    assert set(last["results"]) == set(ONE_INSTANCE_CONFIGS) | {f"lru/{sched}", f"lru+host/{sched}"}
    assert last["results"]["lru"]["scheduling"] == "fcfs" and last["results"]["sam+hints"]["scheduling"] == sched
    assert set(last["hints_vs_same_scheduler"]) == {f"sam+hints+host_vs_lru/{sched}", f"sam+hints+host_vs_lru+host/{sched}"}
    for row in last["ttft_breakdown"]:
        assert row["other_s"] == pytest.approx(0, abs=1e-6)  # the simulator's clock sees all of it
    assert set(last["oracles"]) == {"oracle", "oracle+host"}
    # next-step (the default) never waits; one instance never declines a nested wait
    assert last["load_waits"]["sam+hints+host"] == {"waited": 0, "nested_waits_declined": 0}
    for g in last["goals"].values():
        assert {"target", "measured", "met"} <= set(g) <= {"target", "measured", "met", "ceiling",
                                                            "ceiling_compulsory", "ceiling_contended",
                                                            "ceiling_contended_compulsory", "compute_share",
                                                            "reachable", "bound"}
    ratio = last["goals"]["hit_rate_ratio_vs_lru"]
    assert 0 < ratio["measured"] <= ratio["ceiling"] + 1e-9
    # the oracle is the best Belady over every run's own access order: no run of its tier hits more
    assert set(last["oracle_schedules"].values()) <= set(last["results"])
    for name, r in last["results"].items():
        if name not in last["oracles"]:
            tier = "oracle+host" if "host" in name else "oracle"
            assert r["hit_rate"] <= last["oracles"][tier] + 1e-9, name
    # no policy takes more off a task than its whole serving time
    task = last["goals"]["task_e2e_reduction_vs_lru"]
    assert task["measured"] <= task["ceiling"] < 1
    # reachable: the target within the ceiling (the traces cap the task goal: tool and think time);
    # a goal the run met is within its ceiling, since the ceiling holds for every run
    for g in last["goals"].values():
        assert not (g["met"] and g.get("reachable") is False), g
    assert task["reachable"] is False and ratio["reachable"] is False
    assert "reachable" not in last["goals"]["peak_host_bytes_reduction_vs_lru_host"]  # no ceiling, no verdict
    # TTFT: each call's own prefill alone at the oracle+host's hits (ceiling), at compulsory misses
    # (ceiling_compulsory: no run's mean TTFT is below it); compute_share is the hinted run's waits removed
    ttft = last["goals"]["ttft_reduction_vs_lru_host"]
    assert 0 <= ttft["compute_share"] < 1
    assert ttft["measured"] <= ttft["ceiling_compulsory"] + 1e-9 and ttft["ceiling_compulsory"] < 1
    assert ttft["ceiling"] <= ttft["ceiling_compulsory"] + 1e-9
    # the verdict's ceiling: no run's TTFT is under the contended bound at compulsory misses (here
    # every call's cheapest chunking alone: the calls barely overlap), whatever the policy
    assert ttft["measured"] <= ttft["ceiling_contended_compulsory"] + 1e-9
    assert ttft["reachable"] is False and ttft["ceiling_contended_compulsory"] < 0.3
    bounds = last["ttft_bounds"]
    assert bounds["oracle"] == "oracle+host" and 0 < bounds["compulsory_s"] <= bounds["bound_s"]
    # the goal's bound: the target as a mean TTFT beside the contended bound on the hinted run's arrivals
    tb = ttft["bound"]
    assert tb["arrivals"] == "sam+hints+host" and tb["ttft_s"] == bounds["contended_compulsory_s"]
    assert tb["target_within"] is ttft["reachable"]
    assert tb["target_ttft_s"] == pytest.approx(0.7 * last["results"]["lru+host"]["ttft_mean_s"])
    assert tb["ttft_s"] <= tb["alone_srpt_ttft_s"]
    assert all(r["ttft_mean_s"] >= bounds["compulsory_s"] - 1e-9 for r in last["results"].values() if "ttft_mean_s" in r)
    for row in last["ttft_alone"]:  # the split sums to the mean TTFT
        parts = row["alone_s"] + row["beside_s"] + row["queue_s"] + row["load_s"] + row["blocked_s"]
        assert parts == pytest.approx(row["ttft_mean_s"], abs=1e-6) and row["beside_s"] >= -1e-9
    assert 0 < last["zero_serving_task_s"] <= min(r["task_mean_s"] for r in last["results"].values()
                                                  if "task_mean_s" in r)
    assert "ceiling" in "\n".join(out[:-1])  # the goals table is printed
    assert last["goals"]["sim_wall_s_per_config"]["measured"] > 0


def test_the_loop_runs_without_the_cyclic_collector_and_gives_it_back(workload, costs):
    """The loop turns the automatic collector off (it cost half the wall time) and restores it,
    even when the run fails; the collector state during the run is what a call sees."""
    seen: list[bool] = []
    assert gc.isenabled()
    simulate(workload, CONFIGS["lru"], costs, device_tokens=_room(workload),
             on_call=lambda rec: seen.append(gc.isenabled()))
    assert seen and not any(seen)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), no_cyclic_gc():
        assert not gc.isenabled()
        raise RuntimeError("a failing run")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_block_size_is_simulated_and_printed(traces, capsys):
    """`--block-size 64`: the engine, its tiers and the oracle all count 64-token blocks (an oracle
    left at 16 would count a quarter of its hits and sit below the runs), and the report says so."""
    from hintkv.cli import main

    args = ["sim", "--profile", "h200-llama3-8b", "--users", "2", "--traces", traces, "--token-scale", "0.05",
            "--max-calls", "3", "--max-tasks", "2", "--no-progress", "--device-tokens", "20000",
            "--configs", "lru,sam+hints+host,oracle,oracle+host"]
    assert main([*args, "--block-size", "64"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "block size 64" in out[0]
    last = json.loads(out[-1])
    assert last["block_size"] == 64
    res = last["results"]
    assert res["lru"]["hit_rate"] <= last["oracles"]["oracle"] + 1e-9
    assert res["sam+hints+host"]["hit_rate"] <= last["oracles"]["oracle+host"] + 1e-9
    assert res["sam+hints+host"]["hit_rate"] > 0
    assert main([*args, "--block-size", "0"]) == 2
    assert main([*args, "--block-size", "24"]) == 2  # the engine's blocks are a power of two


def test_zero_serving_time_leaves_each_single_agent_task_its_tool_time(workload, costs):
    """The instant server (`sim.ideal`) takes exactly each call's serving time off a task that is
    one agent's calls in sequence, and no simulated task is shorter than its bound."""
    from hintkv.sim.ideal import zero_serving_spans

    res = simulate(workload, CONFIGS["sam+hints+host"], costs, device_tokens=_room(workload))
    bound = {t.task_id: t.e2e_s for t in zero_serving_spans(workload)}
    sessions: dict[str, set] = {}
    serving: dict[str, float] = {}
    for c in res.calls:
        sessions.setdefault(c.task_id, set()).add(c.session_id)
        serving[c.task_id] = serving.get(c.task_id, 0.0) + c.e2e_s
    single = [t for t in res.tasks if len(sessions[t.task_id]) == 1]
    assert single and len(single) < len(res.tasks)  # both kinds are in the slice
    for t in single:
        assert bound[t.task_id] == pytest.approx(t.e2e_s - serving[t.task_id], abs=1e-6)
    for t in res.tasks:
        assert bound[t.task_id] <= t.e2e_s + 1e-9


def test_the_ttft_ceiling_is_each_calls_prefill_alone_at_the_oracle_host_hits(traces, costs, capsys):
    """The report's `ttft_bounds.bound_s` (the TTFT goal's `ceiling`) recomputed from outside: Belady's
    per-access hits at the oracle+host capacity on the best run's access order, each call's prefill
    alone at them. A bound scaled, taken at the device-only oracle's hits or at the wrong budget fails."""
    from hintkv.cli import main

    budget = 2048  # below the longest uncached tails: the chunking shows in the bound
    wl = build_workload([traces], 3, 0, 0.05, 6, 6)  # what `hintkv sim` builds from the args below
    device = _room(wl)  # the device capacity binds, so the device-only oracle hits less
    assert main(["sim", "--profile", "h200-llama3-8b", "--users", "3", "--seed", "0", "--traces", traces,
                 "--token-scale", "0.05", "--max-calls", "6", "--max-tasks", "6", "--no-progress",
                 "--device-tokens", str(device), "--max-num-batched-tokens", str(budget),
                 "--configs", "lru,sam+hints+host,oracle,oracle+host"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    runs = {n: simulate(wl, resolve(n, last["scheduling"]), costs, device, max_num_batched_tokens=budget)
            for n in ("lru", "sam+hints+host")}
    cap = {"oracle": device // 16, "oracle+host": device // 16 * (1 + HOST_FACTOR)}
    best = runs[last["oracle_schedules"]["oracle+host"]].accesses
    for name, blocks in cap.items():  # the chosen order is the best one at that capacity
        assert max(belady(r.accesses, blocks, 16).hit_rate for r in runs.values()) == pytest.approx(
            last["oracles"][name], abs=1e-12), name
    hits = {n: belady(best, blocks, 16).access_hit_tokens for n, blocks in cap.items()}
    want = bound_at_hits_s(costs, best, hits["oracle+host"], budget)
    bounds = last["ttft_bounds"]
    assert bounds["oracle"] == "oracle+host"
    assert bounds["bound_s"] == pytest.approx(want, rel=1e-12)
    # the check means something: the device-only oracle's hits and the default budget give other bounds
    assert bound_at_hits_s(costs, best, hits["oracle"], budget) > want * 1.05
    assert bound_at_hits_s(costs, best, hits["oracle+host"], 8192) < want * 0.995


def test_a_pool_too_small_for_a_prompt_is_a_usage_error(traces, capsys):
    """A call whose prompt + output cannot fit `--device-tokens` is a bad setting: `hintkv sim` says so
    and exits 2 (before: a ValueError traceback from deep in the run)."""
    from hintkv.cli import main

    args = ["sim", "--profile", "h200-llama3-8b", "--users", "2", "--traces", traces, "--token-scale", "0.05",
            "--max-calls", "3", "--max-tasks", "2", "--no-progress", "--configs", "lru"]
    assert main([*args, "--device-tokens", "64"]) == 2
    err = capsys.readouterr().err
    assert "hintkv sim: a " in err and "do not fit the 64-token device pool" in err and "--device-tokens" in err


def test_a_driver_without_blocks_hashes_nothing_and_times_the_same(workload):
    """`ProgramDriver(blocks=False)` (what `sim.ideal`'s instant replay runs): no block hash, no access
    kept (hashing ~1G prompt tokens was most of that replay's time at full scale), the same calls."""
    from hintkv.sim.agents import ProgramDriver
    from hintkv.sim.clock import EventClock
    from hintkv.sim.cluster import SimCluster
    from hintkv.sim.ideal import InstantEngine
    from hintkv.sim.simulate import whole_program
    from hintkv.workload.agent import HintPlan, workload_programs

    def replay(blocks: bool):
        clock = EventClock()
        d = ProgramDriver(SimCluster([InstantEngine(clock, 16)]), hints=False, blocks=blocks)
        d.start(whole_program(workload_programs(workload, HintPlan(hints=False))))
        while clock.run_next():
            pass
        return d

    on, off = replay(True), replay(False)
    assert on.accesses and off.accesses == [] and all(not m.hashes for m in off._memos.values())
    assert [(c.sent_s, c.prompt_tokens) for c in off.calls] == [(c.sent_s, c.prompt_tokens) for c in on.calls]
