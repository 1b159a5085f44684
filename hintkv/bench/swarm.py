"""`hintkv bench swarm`: real agent traces replayed as a live swarm, against LRU and the oracle.

    hintkv bench swarm [--quick] [--kind swe-agent|swe-team|claude-code] [--traces DIR] [--users 10]
                       [--device-fraction 0.35] [--host-ratio 4] [--peer URL] [--plots DIR]

One workload (`hintkv.workload.users`: N seeded users over real traces, closed loop, staggered),
one set of capacities: the device KV pool is `--device-fraction` of the workload's peak working
set (blocks held by live sessions, measured by the offline replay), the host tier `--host-ratio`
times the device. Live runs, each against its own `hintkv serve` (real HTTP, real model),
measured in interleaved rounds (`swarm_rounds.py`; each live row is the median of its rounds):
lru, lru+host (fcfs, no hints: vLLM, + CPU offload), sam, sam+host (hints, `prefill-judged`),
qlru+host and lru+host/pf (the hinted runs' scheduler, no hints); `--runs` picks among `LIVE`
(`swarm_live.py`), `--peer URL` adds any OpenAI-compatible server. Offline (`hintkv.replay`, the
real cache code on a virtual clock): every configuration of `swarm_study.CONFIGS`, the Belady
oracle and the pinned one (the headroom goal's reference), a capacity sweep and issue 8's headroom
grid. Then a table, PNG plots (`--plots`) and one JSON line with every goal of issue 8, computed
from the runs. What each run is, the pace (`swarm_pace.py`), the parts and the measured figures:
docs/benchmarks/history/swarm.md. prefill-judged is the hinted default: in the simulated
cells (`bench swarm_sched`) it equals prefill-fair; live runs at load could not separate it from
prefill-fair or short-first. `--quick`: 3 calls an agent, the grid at `--users` only.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hintkv.bench.common import (
    ServerProcess,
    add_common_args,
    emit_json,
    log,
    print_table,
)
from hintkv.bench.swarm_goals import compute_goals, get, reduction
from hintkv.bench.swarm_live import (
    DEFAULT_RUNS,
    LIVE,
    admission_of,
    block_bytes,
    launch_servers,
    vocab_size,
)
from hintkv.bench.swarm_pace import pace, reference_speed
from hintkv.bench.swarm_rounds import (
    ROUND_COLUMNS,
    Rounds,
    median_row,
    round_table,
    run_rounds,
    shared_pace,
    spread,
)
from hintkv.bench.swarm_study import ADMISSION, bound_violations, captured, run_configs, size_workload
from hintkv.bench.ttft_breakdown import BREAKDOWN_COLUMNS, breakdown_rows
from hintkv.cache.policies import policy_names
from hintkv.cache.types import OFFLOAD_MODES
from hintkv.config import EngineConfig
from hintkv.replay import OfflineConfig
from hintkv.workload.live import LiveResult
from hintkv.workload.program import Workload
from hintkv.workload.traces import Scale
from hintkv.workload.users import KINDS, build_workload

SWEEP = (0.2, 0.35, 0.5, 1.0)
GRID = ((10, 0.1), (10, 0.35), (32, 0.1), (32, 0.35))  # (users, device fraction) of the headroom goal
COLUMNS = ["run", "where", "admission", "time_scale", "rounds", "calls", "errors", "hit_rate", "host_hit_rate",
           "recomputed_tokens", "computed_tokens", "preemptions", "queue_mean", "ttft_mean_s", "ttft_spread",
           "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_call_mean_s", "e2e_task_mean_s", "task_spread",
           "peak_host_mib", "mean_host_mib", "moved_mib"]


def trace_folder(traces: str, kind: str) -> str:
    """`traces` itself, or its claude-code/ or swe-agent/ subfolder when it has one."""
    sub = os.path.join(traces, "claude-code" if kind == "claude-code" else "swe-agent")
    return sub if os.path.isdir(sub) else traces


def default_traces() -> str:
    for p in (Path(__file__).resolve().parents[3] / "shared" / "traces", Path("/work/shared/traces")):
        if p.exists():
            return str(p)
    return "traces"


def time_scale_arg(v: str) -> str:
    if v != "auto" and not (v.replace(".", "", 1).isdigit() and float(v) > 0):
        raise argparse.ArgumentTypeError(f"--time-scale must be `auto` or a number > 0, got {v!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hintkv bench swarm", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--traces", default=default_traces(), help="a folder of traces, or one with claude-code/ and swe-agent/ in it")
    p.add_argument("--kind", choices=KINDS, default="swe-agent")
    p.add_argument("--users", type=int, default=10)
    p.add_argument("--tasks-per-user", type=int, default=1)
    p.add_argument("--token-scale", type=float, default=1 / 16, help="trace token lengths x this")
    p.add_argument("--time-scale", default="auto", type=time_scale_arg,
                   help="trace seconds per replay second at the offline model's engine speed; `auto` (default): "
                        "the deployment's tool : serving ratio (bench/swarm_pace.py)")
    p.add_argument("--live-pace", choices=("measured", "fixed"), default="measured",
                   help="measured: every server is measured before the rounds; all keep the offline tool : serving "
                        "ratio; fixed: live runs use the offline time scale as is (the pace depends on the machine)")
    p.add_argument("--max-calls", type=int, default=None, help="calls per agent (default: all; --quick: 3)")
    p.add_argument("--rounds", type=lambda v: max(1, int(v)), default=3,
                   help="interleaved live rounds, at least 1 (each live row: their median)")
    p.add_argument("--device-fraction", type=float, default=0.35)
    p.add_argument("--host-ratio", type=float, default=4.0)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--model", default="dummy:tiny")
    p.add_argument("--peer", default=None, help="an OpenAI-compatible server to replay against too")
    p.add_argument("--plots", default=None, help="folder for PNG plots")
    p.add_argument("--skip-live", action="store_true", help="offline replay and oracle only")
    p.add_argument("--runs", default=",".join(DEFAULT_RUNS),
                   help=f"live runs to do (comma-separated, of {[r[0] for r in LIVE]})")
    p.add_argument("--policy", default="sam", choices=policy_names(),
                   help="eviction policy of the hinted runs (the `sam` and `sam+host` rows)")
    p.add_argument("--hinted-offload-mode", default=EngineConfig.__dataclass_fields__["offload_mode"].default,
                   choices=OFFLOAD_MODES, help="`hintkv serve --offload-mode` of the hinted host runs (sam+host; "
                   "default: the server's; lru+host sends no hints)")
    p.add_argument("--hinted-host-mode", default="inclusive", choices=("inclusive", "exclusive"),
                   help="`hintkv serve --host-mode` of the hinted host runs (lru+host stays inclusive)")
    p.add_argument("--server-arg", action="append", default=[], help="extra `hintkv serve` argument (repeat)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    max_calls = args.max_calls or (3 if args.quick else None)
    scale = Scale(args.token_scale, max_calls)
    folder = trace_folder(args.traces, args.kind)
    wl = build_workload(args.kind, folder, args.users, tasks_per_user=args.tasks_per_user, scale=scale, seed=args.seed)
    base = OfflineConfig(block_size=args.block_size)
    tscale = pace(wl, reference_speed(base)) if args.time_scale == "auto" else float(args.time_scale)
    base = replace(base, time_scale=tscale)
    memo: dict = {}
    sizing = size_workload(wl, base, memo)
    device = sizing.device_blocks(args.device_fraction)
    host = round(device * args.host_ratio)
    log(f"workload: {args.kind}, {args.users} users, {len(wl.tasks())} tasks, {sizing.num_calls} calls, "
        f"{sizing.prompt_tokens} prompt tokens; working set {sizing.working_set_blocks} blocks; "
        f"device {device} blocks, host {host}; ideal hit rate {sizing.ideal_hit_rate:.3f}; "
        f"time scale {tscale:.3g} offline ({args.time_scale}), live {args.live_pace}")
    bpb = block_bytes(args.model, args.block_size)
    servers: dict[str, tuple[ServerProcess, bool]] = {}
    live: dict[str, dict[str, Any]] = {}
    live_results: dict[str, LiveResult] = {}
    rounds = Rounds()
    pace_info: dict[str, Any] = {}
    try:
        if not args.skip_live:
            launch_servers(args, device, host, bpb, servers)  # they start up while the offline part runs
        paced = (tscale, reference_speed(base))
        offline = run_configs(wl, base, device, host, memo, hinted=args.policy)
        sweep = {f: run_configs(wl, base, sizing.device_blocks(f), round(sizing.device_blocks(f) * args.host_ratio),
                                memo, hinted=args.policy) for f in SWEEP}
        grid = headroom_grid(args, scale, base, (wl, memo))
        log(f"offline done at {time.perf_counter() - t0:.0f}s")
        urls: dict[str, tuple[str, bool]] = {}
        for name, (srv, hints) in servers.items():  # all up before any replay: no start overlaps one
            try:
                urls[name] = (srv.start().base_url, hints)
            except Exception as exc:  # noqa: BLE001 - that run is reported as failed
                log(f"{name}: did not start: {type(exc).__name__}: {exc}")
                live[name] = {"error": f"did not start: {type(exc).__name__}: {exc}"[:500]}
        if args.peer and not args.skip_live:
            urls["peer"] = (args.peer, False)
        pace_info = shared_pace({k: u for k, (u, _) in urls.items()}, wl, args, paced)
        rounds = run_rounds(urls, wl, args, bpb, pace_info["time_scale"], args.rounds, vocab_size(args.model))
        live.update({name: median_row(rows) for name, rows in rounds.rows.items()})
        live_results = {name: rs[0] for name, rs in rounds.results.items()}  # round 1: the plots
    finally:
        for srv, _ in servers.values():
            srv.stop()
    rows = table_rows(live, offline, args, tscale)
    print_table(rows, COLUMNS)
    if rounds.order:
        print(f"\nlive rounds (each live row above is the median of its {args.rounds} rounds; order rotated):")
        print_table(round_table(rounds), ROUND_COLUMNS)
    breakdown = [b for k, rs in rounds.results.items()
                 for b in breakdown_rows(k, [c for r in rs for c in r.calls if c.ok])]
    if breakdown:
        print("\nwhere the live TTFT went (mean seconds per call; other_s: what no part sees: the client "
              "building the request, uvicorn's parsing, sockets, the client reading):")
        print_table(breakdown, BREAKDOWN_COLUMNS)
    goals = compute_goals(live, offline, sweep, grid)
    judged_on = goals_workload(wl, max_calls, grid_users(args))
    print(f"\ngoals computed on: {judged_on}")
    plots = make_plots(args.plots, live_results, sweep, offline) if args.plots else []
    emit_json({"bench": "swarm", "quick": args.quick, "seed": args.seed, "model": args.model,
               "hinted_policy": args.policy, "hinted_host": [args.hinted_offload_mode, args.hinted_host_mode],
               "workload": {**wl.meta, "calls": sizing.num_calls, "prompt_tokens": sizing.prompt_tokens,
                            "working_set_blocks": sizing.working_set_blocks, "device_blocks": device,
                            "host_blocks": host, "ideal_hit_rate": sizing.ideal_hit_rate,
                            "time_scale": tscale, "time_scale_arg": args.time_scale,
                            "live_pace": args.live_pace, "live_rounds": args.rounds,
                            "live_time_scale": pace_info.get("time_scale"),
                            "live_slowdowns": pace_info.get("slowdowns")},
               "live": live, "offline": _strip(offline),
               "sweep": {str(f): {k: v["hit_rate"] for k, v in runs.items() if isinstance(v, dict)}
                         for f, runs in sweep.items()},
               "headroom_grid": grid, "plots": plots, "ttft_breakdown": breakdown,
               "hints_vs_same_scheduler": {
                   k: {"ttft_reduction": reduction(get(live, "sam+host", "ttft_mean_s"), get(live, k, "ttft_mean_s")),
                       "task_e2e_reduction": reduction(get(live, "sam+host", "e2e_task_mean_s"),
                                                       get(live, k, "e2e_task_mean_s"))}
                   for k in ("qlru+host", "lru+host/pf", "lru+host/sf", "lru+host/ja") if k in live},
               "wall_s": time.perf_counter() - t0, "goals_workload": judged_on, "goals": goals})
    return 0


def goals_workload(wl: Workload, max_calls: int | None, grid: list[int]) -> str:
    """What the goals were computed on: issue 8 sets them for the whole workload; the first calls
    of each agent are a trajectory's opening (swe-agent, 3 calls: 45% of each prompt new vs 1.2%
    over whole trajectories; docs/benchmarks/history/swarm.md), a smoke test. Every call was replayed when no
    agent reached `max_calls` (one of exactly `max_calls` calls may have been cut: not claimed
    whole); `grid`: the user counts of the headroom grid this run computed."""
    m, full_grid = wl.meta, sorted({u for u, _ in GRID})
    what = (f"{m['kind']}, {m['users']} users x {m['tasks_per_user']} task(s), token scale {m['token_scale']:g}, "
            f"headroom grid at {'/'.join(map(str, grid))} users")
    if max_calls is not None and max(len(a.calls) for t in wl.tasks() for a in t.agents()) >= max_calls:
        return f"each agent's first {max_calls} calls ({what}): a smoke test; issue 8's goals are for the full workload"
    if grid != full_grid:
        return f"every call ({what}): the captured-headroom goal is set at {'/'.join(map(str, full_grid))} users"
    return f"the full workload (every call; {what})"


def _strip(runs: dict[str, Any]) -> dict[str, Any]:
    return {k: ({kk: vv for kk, vv in v.items() if kk != "host_samples"} if isinstance(v, dict) else v)
            for k, v in runs.items()}


def grid_users(args: argparse.Namespace) -> list[int]:
    """The headroom grid's user counts this run computes (--quick: `--users` only)."""
    return sorted({u for u, _ in GRID if not args.quick or u == args.users})


def headroom_grid(args: argparse.Namespace, scale: Scale, base: OfflineConfig,
                  main: tuple[Any, dict]) -> list[dict[str, Any]]:
    """Captured headroom of sam (+ hints) over lru, device only and with the host tier, at the
    issue's users x capacities (offline), against the plain oracle (`captured`) and the pinned one
    (`captured_pinned`, the goal's reference while it bounds every run: `swarm_goals`); `main`
    (workload, memo) is reused at `--users`."""
    out = []
    folder = trace_folder(args.traces, args.kind)
    for users in grid_users(args):
        if users == args.users:
            wl, memo = main
        else:
            wl = build_workload(args.kind, folder, users, tasks_per_user=args.tasks_per_user, scale=scale,
                                seed=args.seed)
            memo = {}
            if args.time_scale == "auto":  # each workload at its own deployment pace
                base = replace(base, time_scale=pace(wl, reference_speed(base)))
        sizing = size_workload(wl, base, memo)
        for u, frac in GRID:
            if u != users:
                continue
            dev = sizing.device_blocks(frac)
            runs = run_configs(wl, base, dev, round(dev * args.host_ratio), memo, hinted=args.policy)
            bad = bound_violations(runs, f"{users} users {frac}")
            for tier, sfx in (("device", ""), ("host", "+host")):
                lo, hi, got = (runs[n + sfx]["hit_rate"] for n in ("lru", "oracle", "sam"))
                pin = runs["oracle" + sfx + "/pinned"]
                out.append({"users": users, "fraction": frac, "tier": tier, "lru": lo, "sam": got,
                            "qlru": runs["qlru" + sfx]["hit_rate"], "oracle": hi, "pinned": pin["hit_rate"],
                            "pinned_schedule": pin["schedule"], "captured": captured(got, lo, hi),
                            "captured_pinned": captured(got, lo, pin["hit_rate"]),
                            "violations": [b for b in bad if ("+host" in b.split(" at ")[0]) == (sfx != "")]})
            log(f"grid: {users} users at {frac}: done")
    return out


def table_rows(live: dict, offline: dict, args: argparse.Namespace, time_scale: float) -> list[dict[str, Any]]:
    rows = [{"run": k, "where": "live", "admission": admission_of(k, args.server_arg) if k != "peer" else "-", **v,
             "ttft_spread": spread(v.get("per_round", {}).get("ttft_mean_s", [])),
             "task_spread": spread(v.get("per_round", {}).get("e2e_task_mean_s", []))}
            for k, v in live.items()]
    mib = block_bytes(args.model, args.block_size) / 2**20
    for k, v in offline.items():
        if k.startswith("_"):
            continue
        rows.append({"run": k, "where": "offline", "admission": ADMISSION.get(k, "-"),
                     "time_scale": time_scale, "hit_rate": v["hit_rate"], "host_hit_rate": v.get("host_hit_rate"),
                     "recomputed_tokens": v.get("recomputed_tokens"),
                     "ttft_mean_s": v.get("model_ttft_mean_s"),
                     "peak_host_mib": v["peak_host_blocks"] * mib if "peak_host_blocks" in v else None,
                     "mean_host_mib": v["mean_host_blocks"] * mib if "mean_host_blocks" in v else None})
    return rows


def make_plots(folder: str, live: dict[str, LiveResult], sweep: dict, offline: dict) -> list[str]:
    from hintkv.bench.swarm_plots import plot_all

    try:
        return plot_all(folder, live, sweep, offline)
    except ImportError as exc:
        log(f"plots skipped: {exc}")
        return []


if __name__ == "__main__":
    raise SystemExit(main())
