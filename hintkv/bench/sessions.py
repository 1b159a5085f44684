"""`hintkv bench sessions`: a small agent swarm with and without Agent Hints, one KV budget.

    hintkv bench sessions [--quick] [--seed 0] [--model dummy:tiny] [--kv-fraction 0.33]

A seeded swarm (`hintkv.workload.swarm`: 10 tasks at once, a leader and 3-5 sub-agents each,
shared system prompt and tools, tool waits, sub-agents ending) is sized by its working set
(`hintkv.workload.working_set`: peak distinct KV tokens of the sessions live at once, shared
prefixes counted once). The device KV pool is set to `--kv-fraction` of it (never below what the
longest single request needs), and the same swarm is replayed at scaled real time
(`hintkv.workload.replay`) against two servers started one after the other:

  lru   `--eviction-policy lru` with hints ignored by the server and none sent
  sam   `--eviction-policy sam`, every request carries `agent_hint`, and the agents send
        offload / prefetch / evict the way openJiuwen agent-core does

For each: prefix-cache hit rate (cached over prompt tokens from each reply's usage, and the
server's own counters), TTFT mean/p50/p90, mean end-to-end latency, preemptions, and recomputed
tokens (the server's count if it reports one, else an estimate: prompt tokens an unbounded
prefix cache would have held that the run computed again). Goals (issue 3): hit rate with hints >= 1.33x lru, mean
TTFT with hints >= 40% lower; neither is met when a run errored on more than 1% of its calls
(an errored call is a miss with no TTFT: the figures over the rest would flatter it). A table goes to stdout, then one JSON line; progress to stderr.
`--quick` replays shorter agents (fewer calls each) and finishes in about 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from typing import Any

import httpx

from hintkv.bench.common import (
    CallProgress,
    ServerProcess,
    add_common_args,
    emit_json,
    goal_at_least,
    hintkv_server,
    log,
    print_table,
    ratio,
    summarize,
    unless_errored,
)
from hintkv.workload.replay import ReplayResult, replay_swarm
from hintkv.workload.swarm import Swarm, SwarmShape, generate_swarm
from hintkv.workload.working_set import WorkingSet, chat_encoder, working_set

HIT_RATE_RATIO_TARGET = 1.33
TTFT_REDUCTION_TARGET = 0.40
COLUMNS = ["run", "policy", "hints", "calls", "errors", "hit_rate", "server_hit_rate", "ttft_mean_s",
           "ttft_p50_s", "ttft_p90_s", "e2e_mean_s", "preemptions", "recomputed_tokens", "actions_ok", "wall_s"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hintkv bench sessions", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--model", default="dummy:tiny")
    p.add_argument("--kv-fraction", type=float, default=0.33, help="device KV pool / working set")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--baseline-policy", default="lru")
    p.add_argument("--hints-policy", default="sam")
    defaults = SwarmShape()
    p.add_argument("--token-scale", type=float, default=defaults.token_scale,
                   help="real tokens per replayed token")
    p.add_argument("--time-scale", type=float, default=defaults.time_scale,
                   help="real seconds per replayed second")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra `hintkv serve` argument for both servers (repeat; e.g. --server-arg=--device=cuda)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 0 < args.kv_fraction <= 1:
        print("hintkv bench sessions: --kv-fraction must be in (0, 1]", file=sys.stderr)
        return 2
    swarm = generate_swarm(args.seed, shape_from_args(args))
    log(f"swarm: {len(swarm.tasks)} tasks, {len(swarm.agents())} agents, {swarm.num_calls} calls; tokenizing")
    ws = working_set(swarm, chat_encoder(_tokenizer(args.model)), args.block_size)
    kv_tokens = kv_cache_tokens(ws, args.kv_fraction, args.block_size)
    log(f"working set {ws.tokens} tokens ({ws.num_live} sessions live at {ws.at_s:.1f}s); "
        f"KV pool {kv_tokens} tokens; nominal duration {ws.nominal_duration_s:.1f}s")
    common = ["--kv-cache-tokens", str(kv_tokens), "--block-size", str(args.block_size), *args.server_arg]
    runs = [
        ("lru", args.baseline_policy, False, [*common, "--eviction-policy", args.baseline_policy, hints_off_flag()]),
        ("sam", args.hints_policy, True, [*common, "--eviction-policy", args.hints_policy]),
    ]
    rows = [run_one(name, policy, hints, server_args, swarm, args.model, ws) for name, policy, hints, server_args in runs]
    goals = compute_goals(*rows)
    print_table(rows, COLUMNS)
    emit_json({
        "bench": "sessions",
        "model": args.model,
        "quick": args.quick,
        "seed": args.seed,
        "swarm": swarm_summary(swarm, ws, kv_tokens, args.kv_fraction),
        "runs": {row["run"]: row for row in rows},
        "goals": goals,
    })
    return 0


def compute_goals(base: dict[str, Any], hinted: dict[str, Any]) -> dict[str, Any]:
    """Issue 3's goals from the two runs' rows; neither is met over a run with errored calls (`unless_errored`)."""
    runs = {"lru": base, "sam": hinted}
    return {
        "hit_rate_ratio": unless_errored(goal_at_least(
            HIT_RATE_RATIO_TARGET, ratio(hinted.get("hit_rate"), base.get("hit_rate"))), runs),
        "mean_ttft_reduction": unless_errored(goal_at_least(
            TTFT_REDUCTION_TARGET, _reduction(hinted.get("ttft_mean_s"), base.get("ttft_mean_s"))), runs),
    }


def shape_from_args(args: argparse.Namespace) -> SwarmShape:
    shape = SwarmShape(token_scale=args.token_scale, time_scale=args.time_scale)
    return shape.quick() if args.quick else shape


def kv_cache_tokens(ws: WorkingSet, fraction: float, block_size: int) -> int:
    """`fraction` of the working set in whole blocks, but at least one longest request plus a block."""
    want = math.ceil(fraction * ws.tokens / block_size) * block_size
    least = (math.ceil(ws.max_request_tokens / block_size) + 1) * block_size
    return max(want, least)


def hints_off_flag() -> str:
    """The `hintkv serve` flag that makes the server ignore hints (its name has varied)."""
    from hintkv.cli import build_parser as cli_parser

    for flag in ("--ignore-hints", "--no-hints"):
        _, unknown = cli_parser().parse_known_args(["serve", flag])
        if not unknown:
            return flag
    raise RuntimeError("`hintkv serve` has no flag to ignore hints (--ignore-hints / --no-hints)")


def run_one(name: str, policy: str, hints: bool, server_args: list[str], swarm: Swarm, model: str,
            ws: WorkingSet) -> dict[str, Any]:
    """Start a server, replay the swarm against it, and return the run's table row."""
    row: dict[str, Any] = {"run": name, "policy": policy, "hints": hints}
    try:
        with ServerProcess(hintkv_server(model, name=f"sessions-{name}", extra_args=server_args)) as srv:
            progress = CallProgress(name, swarm.num_calls)
            result = asyncio.run(replay_swarm(swarm, srv.base_url, model, hints=hints, on_call=progress))
            metrics = scrape_metrics(srv.base_url)
    except Exception as exc:  # noqa: BLE001 - one failed run (any cause) still prints the other and unmet goals
        log(f"{name}: failed: {type(exc).__name__}: {exc}")
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        return row
    row.update(run_row(result, metrics, ws))
    log(f"{name}: hit rate {row['hit_rate']}, mean TTFT {row['ttft_mean_s']}, wall {row['wall_s']:.1f}s")
    return row


def run_row(result: ReplayResult, metrics: dict[str, float], ws: WorkingSet) -> dict[str, Any]:
    ok = result.ok_calls
    ttft = summarize([c.ttft_s for c in ok]) if ok else {}
    e2e = [c.e2e_s for c in ok if c.e2e_s is not None]
    errors = [c.error for c in result.calls if c.error]
    reported = [v for k, v in metrics.items() if "recomput" in k]
    # Without a server count: the prompt tokens an unbounded prefix cache would have held, but
    # this run had to compute again (an estimate: the ideal is taken in nominal call order).
    recomputed = sum(reported) if reported else max(0, ws.ideal_hit_tokens - result.cached_tokens)
    return {
        "calls": len(result.calls),
        "errors": result.num_errors,
        "first_error": errors[0] if errors else None,
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "hit_rate": result.hit_rate,
        "server_hit_rate": ratio(metric_total(metrics, "hintkv_prefix_cache_hit_tokens_total"),
                                 metric_total(metrics, "hintkv_prefix_cache_query_tokens_total")),
        "ttft_mean_s": ttft.get("mean"),
        "ttft_p50_s": ttft.get("p50"),
        "ttft_p90_s": ttft.get("p90"),
        "ttft_p99_s": ttft.get("p99"),
        "e2e_mean_s": sum(e2e) / len(e2e) if e2e else None,
        "preemptions": metric_total(metrics, "hintkv_num_preemptions_total"),
        "recomputed_tokens": recomputed,
        "recomputed_reported_by_server": bool(reported),
        "actions_ok": f"{sum(a.ok for a in result.actions)}/{len(result.actions)}" if result.hints else None,
        "action_counts": _action_counts(result),
        "action_mean_s": (sum(a.elapsed_s for a in result.actions) / len(result.actions)) if result.actions else None,
        "hint_edits": {k: v for k, v in metrics.items() if k.startswith("hintkv_agent_hint_edits_total{")},
        "wall_s": result.wall_s,
    }


def _action_counts(result: ReplayResult) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for a in result.actions:
        entry = counts.setdefault(a.action, {"sent": 0, "ok": 0})
        entry["sent"] += 1
        entry["ok"] += int(a.ok)
    return counts


def scrape_metrics(base_url: str) -> dict[str, float]:
    """The server's Prometheus samples, keyed by series (`name{labels}`)."""
    return parse_metrics(httpx.get(base_url + "/metrics", timeout=10.0).text)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {series: value}; comments and unparsable lines are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        try:
            out[series] = float(value)
        except ValueError:
            continue
    return out


def metric_total(metrics: dict[str, float], name: str) -> float | None:
    """The sum of a metric's series over all label sets; None when the server has no such metric."""
    values = [v for k, v in metrics.items() if k == name or k.startswith(name + "{")]
    return sum(values) if values else None


def swarm_summary(swarm: Swarm, ws: WorkingSet, kv_tokens: int, fraction: float) -> dict[str, Any]:
    shape = swarm.shape
    return {
        "tasks": len(swarm.tasks),
        "agents": len(swarm.agents()),
        "calls": swarm.num_calls,
        "prompt_tokens": ws.prompt_tokens,
        "ideal_hit_rate": ws.ideal_hit_rate,
        "ideal_hit_tokens": ws.ideal_hit_tokens,
        "working_set_tokens": ws.tokens,
        "working_set_unshared_tokens": ws.unshared_tokens,
        "live_sessions_at_peak": ws.num_live,
        "max_request_tokens": ws.max_request_tokens,
        "nominal_duration_s": ws.nominal_duration_s,
        "kv_cache_tokens": kv_tokens,
        "kv_fraction": fraction,
        "kv_fraction_actual": kv_tokens / ws.tokens if ws.tokens else None,
        "token_scale": shape.token_scale,
        "time_scale": shape.time_scale,
        "sub_call_scale": shape.sub_call_scale,
    }


def _reduction(new: float | None, old: float | None) -> float | None:
    """1 - new/old: how much lower `new` is, as a fraction of `old`."""
    r = ratio(new, old)
    return None if r is None else 1.0 - r


def _tokenizer(model: str):
    """The tokenizer the server will use for `model` (dummy presets talk SmolLM2)."""
    from hintkv.models.presets import DEFAULT_MODEL, smollm2_tokenizer

    if model.startswith("dummy:") or model == DEFAULT_MODEL:
        return smollm2_tokenizer()
    from hintkv.models.loader import load_model

    return load_model(model).tokenizer


if __name__ == "__main__":
    raise SystemExit(main())
