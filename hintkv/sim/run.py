"""`hintkv sim`: the swarm benchmark's configurations at full token scale, in simulated time.

    hintkv sim --profile h200-llama3-8b [--users 10] [--instances 1] [--traces DIR ...] [--quick] [--seed 0]
               [--configs lru,sam+hints,...] [--device-tokens N] [--plots DIR]

The real traces (`sim.workload`) are played by `sim.agents` against `sim.engine.SimEngine` (the
real scheduler, KV manager, SAM and policies; the forward pass and copies from the profile's cost
model) once per configuration, all on the same workload. Device KV capacity defaults to the
profile's (`Profile.device_kv_tokens`: what one H200 holds beside the weights). `ideal` is the
same workload on an unbounded device cache: no policy can hit more (an upper bound of the oracle).

Prints a table (TTFT mean/p50/p90/p99, end-to-end per call and per task, token hit rate,
recomputed prefill tokens, peak and mean host-tier bytes, bytes moved, engine steps, simulated
time, wall time and simulated requests per wall second), writes plots (TTFT CDFs) with `--plots`, and ends with one JSON line whose `goals`
are the issue's, computed from the runs.

`--instances N` (> 1) runs N engines on one clock behind the router's placement code
(`sim.cluster`) with the shared pool under each host tier (`sim.pool`): the configurations are
then lru (device only), lru+pool (host + a plain LRU pool, `--pool-policy lru`) and
sam+hints+pool (host + SPM, the server's default: no write-through), sam+hints+pool+wt (SPM with
`--pool-write-through`), and the goals compare sam+hints+pool with lru+pool where the one
instance compares sam+hints+host with lru+host. Peak host / pool bytes are cluster-wide.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from hintkv.bench.common import emit_json, percentile, print_table
from hintkv.bench.ttft_breakdown import BREAKDOWN_COLUMNS, breakdown_rows
from hintkv.cache.types import OFFLOAD_MODES
from hintkv.config import EngineConfig
from hintkv.engine.admission import admission_names, live_admission_error, live_admission_names
from hintkv.engine.load_timing import load_timing_names
from hintkv.sim.bound import alone_rows
from hintkv.sim.contended import contended_bounds
from hintkv.sim.costs import CostModel
from hintkv.sim.engine import PromptDoesNotFit
from hintkv.sim.gap import gap_rows, worst_calls
from hintkv.sim.goals import goals, separation
from hintkv.sim.ideal import zero_serving_task_s
from hintkv.sim.oracles import OracleBook
from hintkv.sim.profile import load_profile, profile_names
from hintkv.sim.simulate import (
    CONFIGS,
    HOST_FACTOR,
    POOL_FACTOR,
    SimConfig,
    SimResult,
    num_host_blocks,
    simulate,
)
from hintkv.sim.workload import DEFAULT_TRACES, build_workload
from hintkv.sim.workload_cache import KEEP, cached_workload

ORACLES = ("oracle", "oracle+host", "oracle+pool")
ONE_INSTANCE_CONFIGS = ("lru", "lru+host", "sam+hints", "sam+hints+host", "oracle", "oracle+host")
CLUSTER_CONFIGS = ("lru", "lru+pool", "sam+hints+pool", "sam+hints+pool+wt", "oracle", "oracle+pool")
QUICK = {"token_scale": 0.25, "max_calls": 12, "max_tasks": 20}
ENGINE_LOAD_TIMING = EngineConfig.__dataclass_fields__["load_timing"].default  # the engine's default
ENGINE_OFFLOAD_MODE = EngineConfig.__dataclass_fields__["offload_mode"].default  # `hintkv serve`'s
# hintkv's scheduler for the hinted configurations (lru runs keep fcfs; the default configs add the
# lru ones under it too). srpt-drain: the whole trace set at 10 users, hinted short-first 0.8608 s,
# srpt-room 0.8101, srpt-drain 0.8048 (docs/benchmarks/history/sim.md, seventeenth session, sched2;
# eighteenth session, simroom); after review_drain1's mends (1bc2323) 0.8035 (nineteenth session,
# room2). It is also the cluster rows' default (--instances > 1), measured there in the nineteenth
# session (scale4): srpt-drain on 1bc2323, lru+pool 2.5686 s and hinted 2.5659 at 100 users / 8
# instances, 7.3675 and 7.0432 at 1000 / 64; srpt on 8b58120 (before 8f3c93e's short_rest, which
# srpt's `cap` reads too: not re-run), 2.7456 and 2.7393 at 100, 11.8865 and 11.3048 at 1000
# (history/sim.md, nineteenth session, scale4). srpt-resume (opt-in; hinted 0.7981 at 10 users, room2) loses in
# the cluster: hinted 2.78269 s at 100 users on 1167111, 7.19224 at 1000 on e6de0b6 (twentieth session, scale5);
# 7.17451 at 1000 on 02f484c, after cf8ca18 (+1.87% vs srpt-drain's 7.0432; twenty-first session, scale6).
# srpt-land (opt-in; chunks end by a load's landing) wins the hinted mean at 10, 100 and 1000 users (-0.46%, -0.78%,
# -0.98%) but loses on the unhinted whole set (lru+host/srpt-land +0.23%) and its p99 at each scale (+0.3-0.7%):
# not the default. srpt-cap (opt-in) wins the hinted mean on 668c51f at 10, 100 and 1000 users (0.79500 s, -1.05%;
# -0.31%; 6.64499, -5.64%) and lru+host/srpt-cap -0.86%, but its p99 at 100 users is +31.3% (57.08 -> 74.96 s) and
# lru+pool/srpt-cap at 1000 users +2.47% (history/sim.md, twenty-fourth session, room7). srpt-swap (srpt-drain plus
# prefill-judged's swaps) wins everywhere measured, hinted and unhinted, mean and p99: 10 users 0.78895 s (-1.81%;
# lru+host/srpt-swap -0.45%), 100 users 2.51342 (-2.04%; lru+pool -2.78%), 1000 users 6.41969 (-8.84%; lru+pool
# -8.96%) (history/sim.md, twenty-fifth session, room8): the default. --quick's: unmeasured
SCHEDULING = "srpt-swap"


def resolve(name: str, scheduling: str) -> SimConfig:
    """A configuration by name: lru ones run fcfs (vLLM); hinted ones run `scheduling`;
    `NAME/POLICY` runs NAME under POLICY (`lru+host/short-first`: the scheduler without hints, to
    separate what it gives every policy from what hints give)."""
    base, _, pol = name.partition("/")
    cfg = CONFIGS[base]
    if pol:
        return dataclasses.replace(cfg, name=name, scheduling=pol)
    return dataclasses.replace(cfg, scheduling=scheduling) if cfg.hints else cfg


def default_configs(defaults: tuple[str, ...], scheduling: str) -> list[str]:
    """`defaults`, plus each non-hinted lru configuration under `scheduling` (when not fcfs)."""
    names = [n for n in defaults if n not in ORACLES]
    if scheduling != "fcfs":
        names += [f"{n}/{scheduling}" for n in names if not CONFIGS[n].hints]
    return [*names, *(n for n in defaults if n in ORACLES)]


def known(name: str) -> bool:
    base, _, pol = name.partition("/")
    return name in ORACLES or (base in CONFIGS and pol in ("", *live_admission_names()))


def _row(r: SimResult, scheduling: str) -> dict:
    ttft = [c.ttft_s for c in r.calls if c.ttft_s is not None]
    e2e = [c.e2e_s for c in r.calls if c.e2e_s is not None]
    return {"config": r.config, "scheduling": scheduling, "calls": len(r.calls),
            "ttft_mean_s": r.mean_ttft_s, "ttft_p50_s": percentile(ttft, 50),
            "ttft_p90_s": percentile(ttft, 90), "ttft_p99_s": percentile(ttft, 99),
            "e2e_call_mean_s": sum(e2e) / len(e2e) if e2e else None, "task_mean_s": r.mean_task_s,
            "hit_rate": r.hit_rate, "host_hit_rate": r.host_hit_tokens / max(1, r.prompt_tokens),
            "recomputed_Mtok": r.prompt_tokens_computed / 1e6,
            "peak_host_GB": r.peak_host_bytes / 1e9, "mean_host_GB": r.mean_host_bytes / 1e9,
            "moved_GB": sum(r.bytes_moved.values()) / 1e9,
            "pool_hit_rate": r.pool_hit_tokens / max(1, r.prompt_tokens),
            "peak_pool_GB": r.peak_pool_bytes / 1e9, "preempt": r.num_preemptions, "steps": r.num_steps, "sim_s": r.sim_s, "wall_s": r.wall_s,
            "sim_req_per_s": r.sim_requests_per_s}


def _plots(results: dict[str, SimResult], folder: Path, title: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        xs = sorted(c.ttft_s for c in r.calls if c.ttft_s is not None)
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (simulated s)")
    ax.set_ylabel("fraction of calls")
    ax.set_title(title)
    ax.legend()
    path = folder / "sim_ttft_cdf.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [str(path)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hintkv sim", description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="h200-llama3-8b", help=f"one of {profile_names()} or a JSON file")
    p.add_argument("--users", type=int, default=10)
    p.add_argument("--instances", type=int, default=1,
                   help="engines behind the router's placement, with the shared pool (8 for 100 users, "
                        "64 for 1000)")
    p.add_argument("--max-inflight", type=int, default=8, help="the router's room for a sub-agent")
    p.add_argument("--traces", nargs="+", default=list(DEFAULT_TRACES))
    p.add_argument("--configs", default=None, help="default: lru, lru+host, sam+hints, sam+hints+host and "
                   f"the oracles on one instance; {','.join(CLUSTER_CONFIGS)} with --instances > 1; and the lru "
                   "ones again under the hinted runs' scheduler S as NAME/S")
    p.add_argument("--scheduling-policy", default=SCHEDULING, choices=admission_names(),
                   help="the hinted configurations' scheduler (lru configurations keep fcfs = vLLM)")
    p.add_argument("--hinted-offload-mode", default=ENGINE_OFFLOAD_MODE, choices=OFFLOAD_MODES,
                   help="`hintkv serve --offload-mode` of the hinted configurations (deferred: the server's "
                        "default, write nothing at the hint, demote only; lazy: write at the hint, keep the copy)")
    p.add_argument("--load-timing", default=ENGINE_LOAD_TIMING, choices=load_timing_names(),
                   help="when a host hit computes (engine.load_timing), for every configuration")
    p.add_argument("--device-tokens", type=int, default=None)
    p.add_argument("--host-factor", type=float, default=HOST_FACTOR,
                   help="each instance's host tier / its device pool (bench swarm's 4; a smaller one sends a "
                        "cut workload's host evictions to the shared pool)")
    p.add_argument("--token-scale", type=float, default=1.0)
    p.add_argument("--max-calls", type=int, default=None, help="cut each agent to its first N calls")
    p.add_argument("--max-tasks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16,
                   help="the simulated engine's KV block size in tokens (vLLM's default on an H200: 16; the "
                        "traces' own blocks are 64); printed in the report")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help=f"a reduced workload: {QUICK}")
    p.add_argument("--plots", type=Path, default=None, help="write PNG plots here")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--workload-cache", type=Path, default=None, metavar="DIR",
                   help="keep the built workload in DIR, keyed by the traces' bytes, the knobs, the loaders' "
                        "source and the tokenizer; a damaged file is built again with a warning; DIR keeps its "
                        f"{KEEP} newest files (sim/workload_cache.py; a pickle: a directory you own)")
    p.add_argument("--worst-calls", type=int, default=0, metavar="N",
                   help="print each run's N calls with the largest excess over their own TTFT bound, with its "
                        "parts (sim/gap.py; off by default)")
    p.add_argument("--no-fast-decode", action="store_true",
                   help="step every decode (no decode stretches as one event: the same report, slower)")
    args = p.parse_args(argv)
    if (why := live_admission_error(args.scheduling_policy)) is not None:
        p.error(f"--scheduling-policy: {why}")  # the simulator runs the live engine's scheduler
    if args.quick:
        args.token_scale = min(args.token_scale, QUICK["token_scale"])
        args.max_calls = args.max_calls or QUICK["max_calls"]
        args.max_tasks = args.max_tasks or QUICK["max_tasks"]
    try:
        profile = load_profile(args.profile)
    except ValueError as exc:
        print(f"hintkv sim: {exc}", file=sys.stderr)
        return 2
    costs = CostModel(profile)
    if args.instances < 1:
        print("hintkv sim: --instances must be >= 1", file=sys.stderr)
        return 2
    if not args.host_factor > 0:
        print("hintkv sim: --host-factor must be > 0", file=sys.stderr)
        return 2
    if args.block_size < 1 or args.block_size & (args.block_size - 1):
        print("hintkv sim: --block-size must be a power of two", file=sys.stderr)
        return 2
    default = CLUSTER_CONFIGS if args.instances > 1 else ONE_INSTANCE_CONFIGS
    names = ([n.strip() for n in args.configs.split(",") if n.strip()] if args.configs
             else default_configs(default, args.scheduling_policy))
    unknown = [n for n in names if not known(n)]
    for why in {live_admission_error(n.partition("/")[2]) for n in unknown} - {None}:
        print(f"hintkv sim: --configs: {why}", file=sys.stderr)
    if unknown:
        print(f"hintkv sim: unknown configs {unknown}; known: {[*CONFIGS, *ORACLES]}", file=sys.stderr)
        return 2
    if any(n in ORACLES for n in names) and "lru" not in names:
        names.insert(0, "lru")  # the oracle replays the lru run's accesses
    device_tokens = args.device_tokens or int(profile.device_kv_tokens * args.token_scale)
    t0 = time.perf_counter()
    if args.workload_cache is not None:
        wl, from_cache = cached_workload(args.workload_cache, args.traces, args.users, args.seed,
                                         args.token_scale, args.max_calls, args.max_tasks)
    else:
        wl, from_cache = build_workload(args.traces, args.users, args.seed, args.token_scale, args.max_calls,
                                        args.max_tasks), False
    load_s = time.perf_counter() - t0
    bound_task_s = zero_serving_task_s(wl, args.block_size)  # no policy's mean task time is below it
    source = " (from --workload-cache)" if from_cache else ""
    print(f"[sim] workload: {len(wl.tasks())} tasks, {wl.num_calls} calls, {wl.prompt_tokens / 1e6:.1f}M "
          f"prompt tokens, {args.users} users on {args.instances} instance(s); profile {profile.name}; device "
          f"{device_tokens} tokens; loaded in {load_s:.1f}s{source}", file=sys.stderr, flush=True)
    results: dict[str, SimResult] = {}
    scheduling: dict[str, str] = {}
    blocks = device_tokens // args.block_size
    host = num_host_blocks(args.host_factor, blocks)
    per = {"oracle": blocks, "oracle+host": blocks + host, "oracle+pool": blocks + host + POOL_FACTOR * blocks}
    # one cache of the cluster's capacity; each run's Belady passes run as it ends (sim.oracles)
    book = OracleBook({n: per[n] * args.instances for n in names if n in ORACLES}, args.block_size,
                      costs, args.max_num_batched_tokens)
    for name in names:
        if name not in ORACLES:
            cfg = resolve(name, args.scheduling_policy)
            scheduling[name] = cfg.scheduling
            try:
                results[name] = simulate(wl, cfg, costs, device_tokens, block_size=args.block_size,
                                         max_num_seqs=args.max_num_seqs,
                                         max_num_batched_tokens=args.max_num_batched_tokens,
                                         progress=not args.no_progress, instances=args.instances,
                                         max_inflight=args.max_inflight, fast_decode=not args.no_fast_decode,
                                         load_timing=args.load_timing,
                                         offload_mode=args.hinted_offload_mode,
                                         host_factor=args.host_factor)
            except PromptDoesNotFit as exc:
                print(f"hintkv sim: {exc}", file=sys.stderr)
                return 2
            book.take(name, results[name])
    oracles, oracle_schedules = book.hit_rates, book.schedules
    rows = [_row(r, scheduling[n]) for n, r in results.items()]
    rows += [{"config": n, "calls": book.num_accesses, "hit_rate": oracles[n]} for n in names if n in ORACLES]
    print(f"hintkv sim --profile {profile.name}: {args.users} users, {args.instances} instance(s), "
          f"{len(wl.tasks())} tasks, {wl.num_calls} calls, token scale {args.token_scale}, "
          f"device {device_tokens} tokens, block size {args.block_size}, seed {args.seed}, load timing {args.load_timing}")
    print_table(rows, list(rows[0]))
    breakdown = [b for n, r in results.items() for b in breakdown_rows(n, r.calls)]
    print("\nwhere the TTFT went (mean seconds per call; the parts sum to ttft_mean_s):")
    print_table(breakdown, BREAKDOWN_COLUMNS)
    why = [{"run": n, **{f"{k}_s": v / max(1, len(r.calls)) for k, v in r.wait_s.items()}}
           for n, r in results.items()]
    print("\nwhy the queue waited (seconds per call: step = arrived during a step; else what bound the step "
          "that left it waiting: budget = token budget full, seqs = max_num_seqs running, room = neither):")
    print_table(why, list(why[0]))
    waits = {n: {"waited": r.load_waits, "nested_waits_declined": r.nested_waits_declined}
             for n, r in results.items()}
    print("\nsame-step load waits (waited: steps that waited for a load; nested_waits_declined: steps "
          "inside another instance's wait, which took next-step timing instead: sim/clock.py): "
          + ", ".join(f"{n} {w['waited']}/{w['nested_waits_declined']}" for n, w in waits.items()))
    budget = args.max_num_batched_tokens
    alone = alone_rows(costs, results, budget)
    print("\nthe TTFT with each call's own prefill alone split out (mean s per call: alone_s = its uncached "
          "tokens at its own hits alone on the instance; beside_s = the rest of its forward steps' time)")
    print_table(alone, list(alone[0]))
    bounds = {**book.bounds(), **contended_bounds(costs, results, book, budget)}
    if bounds:
        print(f"TTFT bound (each call's own prefill alone): {bounds['bound_s']:.4f} s at {bounds['oracle']}'s "
              f"hits, {bounds['compulsory_s']:.4f} s at compulsory misses")
    if bounds.get("contended_none_why"):
        print(f"no TTFT bound with the prefills that must overlap on this profile: {bounds['contended_none_why']}")
    elif "contended_s" in bounds:
        print(f"TTFT bound with the prefills that must overlap ({bounds['contended_run']}'s arrivals, shortest "
              f"remaining work first on each instance; sim/contended.py): {bounds['contended_s']:.4f} s at "
              f"{bounds['oracle']}'s hits, {bounds['contended_compulsory_s']:.4f} s at compulsory misses")
        print("the same at compulsory misses on each run's own arrivals: " + ", ".join(
            f"{n} {s:.4f} s" for n, s in bounds["bound_over_arrivals"].items()))
    gap = gap_rows(costs, results, book.own_hits, budget)
    if gap:
        print(f"\nthe gap to the bound per call (mean s per call; each run against its own access order's "
              f"{book.bound_tier} hits: excess = ttft - bound = hits + beside + queue + load + blocked; sim/gap.py)")
        print_table(gap, list(gap[0]))
    worst = worst_calls(costs, results, book.own_hits, budget, args.worst_calls)
    if worst:
        print(f"\nthe {args.worst_calls} calls of each run with the largest excess over their own bound (s, this "
              "call's: excess = hits + beside + queue + load + blocked)")
        print_table(worst, list(worst[0]))
    g = goals(results, oracles, args.users, bound_task_s, bounds)
    if (tb := g["ttft_reduction_vs_lru_host"]["bound"]) is not None and tb["alone_srpt_ttft_s"] is not None:
        within, within_alone = ("within" if tb[k] else "BEYOND" for k in ("target_within", "target_within_alone_srpt"))
        print(f"TTFT goal vs lru+host as a mean: {tb['target_ttft_s']:.4f} s; the bound above (compulsory misses) on "
              f"{tb['arrivals']}'s arrivals {tb['ttft_s']:.4f} s (target {within} it); SRPT over each call's "
              f"prefill alone at the oracle's hits {tb['alone_srpt_ttft_s']:.4f} s (not a bound: batched prefills "
              f"share a step's launch-bound cost; target {within_alone} it)")
    print("\nthe goals; ceiling: hit rate, the oracle's (best Belady over the runs' access orders) over "
          "lru's; task, zero serving time; TTFT, each call's own prefill alone at the oracle's hits "
          "(ceiling_compulsory: at compulsory misses; ceiling_contended[_compulsory]: the same hits with the "
          "prefills that must overlap served shortest remaining work first on the hinted run's arrivals). "
          "compute_share (NOT a bound): the hinted run with its waits removed; reachable: the target within the "
          "ceiling (TTFT: the contended one at compulsory misses, on the hinted run's arrivals, else unknown; "
          "hit rate: on the runs' access orders)")
    cols = ["goal", "target", "measured", "met", "reachable", "ceiling", "ceiling_compulsory", "ceiling_contended",
            "ceiling_contended_compulsory", "compute_share"]
    print_table([{"goal": k, **{c: v.get(c, "-") for c in cols[1:]}} for k, v in g.items()], cols)
    plots = _plots(results, args.plots, f"{profile.name}, {args.users} users") if args.plots else []
    emit_json({"bench": "sim", "profile": profile.name, "users": args.users, "instances": args.instances,
               "router": {n: r.router for n, r in results.items()},
               "pool": {n: r.pool_stats for n, r in results.items() if r.pool_stats},
               "seed": args.seed, "token_scale": args.token_scale, "device_tokens": device_tokens,
               "block_size": args.block_size, "host_factor": args.host_factor,
               "tasks": len(wl.tasks()), "calls": wl.num_calls, "workload_load_s": round(load_s, 2),
               "workload_from_cache": from_cache,
               "results": {r["config"]: {k: v for k, v in r.items() if k != "config"} for r in rows},
               "oracles": oracles, "oracle_schedules": oracle_schedules, "plots": plots, "scheduling": args.scheduling_policy, "hinted_offload_mode": args.hinted_offload_mode,
               "load_timing": args.load_timing, "ttft_breakdown": breakdown, "ttft_alone": alone, "ttft_bounds": bounds, "ttft_gap": gap, "ttft_worst_calls": worst, "queue_why": why, "load_waits": waits, "hints_vs_same_scheduler": separation(results, args.scheduling_policy),
               "zero_serving_task_s": bound_task_s, "goals": g})
    return 0
