"""`hintkv bench pool`: two instances behind the router on one Mooncake pool, SPM vs plain LRU.

    hintkv bench pool [--quick] [--seed 0] [--model dummy:tiny] [--pool-fraction 1.0]
                      [--kv-fraction 0.33] [--backend mooncake|embedded] [--vllm-router auto]

One seeded agent swarm (`hintkv.workload.swarm`: leaders and sub-agents, shared prompts, tool
waits, hints as openJiuwen agent-core sends them) is replayed through `hintkv router` in front of
two `hintkv serve` instances that share one pool (a real `mooncake_master` started here; a fresh
one per run). Each instance's device KV is `--kv-fraction` of the swarm's working set; the pool
holds `--pool-fraction` of it in all (split between the instances). Runs, same swarm, same
capacities:

  lru    `--pool-policy lru`: the pool as a plain LRU store (every block written through or
         evicted down is kept until capacity pushes it out; no removals, no keep-alive)
  spm    `--pool-policy spm`: session semantics (ended sessions' blocks removed at once, live
         sessions kept alive in batches, session-aware victims, prefetch through the pool)
  spm+vllm-router   (full runs, if PyPI `vllm-router` is installed; `--vllm-router on` forces
         it) the spm instances behind `vllm-router --policy consistent_hash` instead of hintkv's
         router: the same pool, no parent-aware placement and no evict fan-out

Pool bytes are sampled from the master's `master_allocated_bytes` every 0.25 s (peak, mean);
hit rate is cached over prompt tokens from every reply's usage. Goals (issue 10): peak pool bytes
with SPM at least 25% lower than LRU, at an equal or better hit rate (within one point: the
replay runs at wall-clock time on a shared machine); neither is met when a run errored on more than 1%
of its calls. A table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self

import httpx

from hintkv.bench.common import (
    CallProgress,
    ServerProcess,
    ServerSpec,
    add_common_args,
    emit_json,
    goal_at_least,
    hintkv_server,
    log,
    print_table,
    summarize,
    unless_errored,
)
from hintkv.bench.sessions import (
    _tokenizer,
    kv_cache_tokens,
    metric_total,
    scrape_metrics,
)
from hintkv.workload.replay import replay_swarm
from hintkv.workload.swarm import SwarmShape, generate_swarm
from hintkv.workload.working_set import chat_encoder, working_set

PEAK_REDUCTION_TARGET = 0.25
HIT_RATE_TOLERANCE = 0.01  # "equal": within one point of LRU's hit rate
COLUMNS = ["run", "router", "calls", "errors", "hit_rate", "pool_hit_tokens", "pool_peak_mib",
           "pool_mean_mib", "instances_peak_mib", "puts", "dedup", "removed", "released", "evicted",
           "keepalive_calls", "ttft_mean_s", "ttft_p90_s", "wall_s"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hintkv bench pool", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--model", default="dummy:tiny")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-fraction", type=float, default=0.33,
                   help="each instance's device KV / the swarm's working set")
    p.add_argument("--pool-fraction", type=float, default=1.0,
                   help="pool capacity (both instances together) / the working set")
    p.add_argument("--backend", default="mooncake", choices=["mooncake", "embedded"])
    p.add_argument("--vllm-router", choices=["auto", "on", "off"], default="auto",
                   help="also run the spm instances behind PyPI vllm-router (auto: if installed, "
                   "and not with --quick)")
    defaults = SwarmShape()
    p.add_argument("--token-scale", type=float, default=defaults.token_scale)
    p.add_argument("--time-scale", type=float, default=defaults.time_scale)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shape = SwarmShape(token_scale=args.token_scale, time_scale=args.time_scale)
    if args.quick:  # fewer tasks at once, shorter agents: under 3 minutes on 2 cores
        from dataclasses import replace
        shape = replace(shape.quick(), num_tasks=5, task_stagger_s=10.0,
                        time_scale=2 * args.time_scale)
    swarm = generate_swarm(args.seed, shape)
    log(f"swarm: {len(swarm.tasks)} tasks, {len(swarm.agents())} agents, {swarm.num_calls} calls")
    ws = working_set(swarm, chat_encoder(_tokenizer(args.model)), args.block_size)
    kv_tokens = kv_cache_tokens(ws, args.kv_fraction, args.block_size)
    frame = frame_bytes(args.model, args.block_size)
    pool_blocks = max(2, math.ceil(args.pool_fraction * ws.tokens / args.block_size))
    per_instance = math.ceil(pool_blocks / 2) * frame
    log(f"working set {ws.tokens} tokens; device KV {kv_tokens} tokens per instance; pool "
        f"{pool_blocks} blocks ({2 * per_instance / 2**20:.1f} MiB) in all")
    runs = [("lru", "hintkv"), ("spm", "hintkv")]
    have = importlib.util.find_spec("vllm_router") is not None
    if args.vllm_router == "on" or (args.vllm_router == "auto" and have and not args.quick):
        runs.append(("spm", "vllm-router"))
    rows = [run_one(policy, router, swarm, args, kv_tokens, per_instance, ws.tokens)
            for policy, router in runs]
    goals = compute_goals(rows[0], rows[1])
    print_table(rows, COLUMNS)
    emit_json({"bench": "pool", "model": args.model, "quick": args.quick, "seed": args.seed,
               "backend": args.backend,
               "swarm": {"tasks": len(swarm.tasks), "agents": len(swarm.agents()),
                         "calls": swarm.num_calls, "working_set_tokens": ws.tokens,
                         "ideal_hit_rate": ws.ideal_hit_rate},
               "kv_cache_tokens_per_instance": kv_tokens,
               "pool_bytes_per_instance": per_instance, "pool_fraction": args.pool_fraction,
               "runs": {f"{r['run']}+{r['router']}": r for r in rows}, "goals": goals})
    return 0


def compute_goals(lru: dict[str, Any], spm: dict[str, Any]) -> dict[str, Any]:
    """Issue 10's goals from the lru and spm rows; neither is met over a run with errored calls
    (`unless_errored`: a call that failed stored and read nothing in the pool)."""
    peak_cut = None
    if lru.get("pool_peak_bytes") and spm.get("pool_peak_bytes") is not None:
        peak_cut = 1.0 - spm["pool_peak_bytes"] / lru["pool_peak_bytes"]
    delta = None
    if lru.get("hit_rate") is not None and spm.get("hit_rate") is not None:
        delta = spm["hit_rate"] - lru["hit_rate"]
    runs = {"lru": lru, "spm": spm}
    return {
        "peak_pool_reduction": unless_errored(goal_at_least(PEAK_REDUCTION_TARGET, peak_cut), runs),
        "hit_rate_delta_vs_lru": unless_errored(goal_at_least(-HIT_RATE_TOLERANCE, delta), runs),
    }


def frame_bytes(model: str, block_size: int) -> int:
    """Bytes one block takes in the pool (header + payload), for the server's default dtype."""
    import torch

    from hintkv.engine.model_runner import kv_bytes_per_block
    from hintkv.models.presets import preset_config
    from hintkv.tiers.disk_format import HEADER_SIZE

    if model.startswith("dummy:"):
        cfg = preset_config(model.removeprefix("dummy:"))
    else:
        from hintkv.models.loader import load_model
        cfg = load_model(model).config
    return HEADER_SIZE + kv_bytes_per_block(cfg, block_size, torch.float32)


class _Sampler:
    """Samples pool bytes every `every_s` on a thread: the master's figure, and the sum of the
    instances' own (`hintkv_pool_bytes`)."""

    def __init__(self, master, instances: list[str], every_s: float = 0.25) -> None:
        self.master, self.instances, self.every_s = master, instances, every_s
        self.master_bytes: list[float] = []
        self.instance_bytes: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.master is not None:
                    self.master_bytes.append(self.master.allocated_bytes())
                self.instance_bytes.append(sum(
                    metric_total(scrape_metrics(u), "hintkv_pool_bytes") or 0
                    for u in self.instances))
            except Exception as exc:  # noqa: BLE001 - a missed sample is not a failed run
                log(f"pool sampler: {type(exc).__name__}: {exc}")
            self._stop.wait(self.every_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def run_one(policy: str, router: str, swarm, args, kv_tokens: int, pool_bytes: int,
            ws_tokens: int) -> dict[str, Any]:
    row: dict[str, Any] = {"run": policy, "router": router}
    master = None
    try:
        # write-through on: this bench measures the pool itself (a roomy host tier would keep
        # every block out of it otherwise), as it did when write-through was the default
        pool_args = ["--pool", args.backend, "--pool-size", str(pool_bytes),
                     "--pool-policy", policy, "--pool-write-through"]
        if args.backend == "mooncake":
            from hintkv.pool.master import MooncakeMaster
            master = MooncakeMaster(log_path=f"{tempfile.gettempdir()}/hintkv-bench-pool-master.log")
            master.start()
            pool_args += ["--pool-master", master.rpc_address, "--pool-metadata",
                          master.metadata_url]
        else:
            pool_args += ["--pool-dir", tempfile.mkdtemp(prefix="hintkv-bench-pool-")]
        common = ["--kv-cache-tokens", str(kv_tokens), "--block-size", str(args.block_size),
                  "--eviction-policy", "sam", *pool_args]
        with contextlib.ExitStack() as stack:
            a, b = start_all(stack, [
                ServerProcess(hintkv_server(args.model, name=f"pool-{policy}-{n}",
                                            extra_args=common)) for n in "ab"])
            front = stack.enter_context(ServerProcess(router_spec(router, [a.base_url,
                                                                             b.base_url])))
            sampler = stack.enter_context(_Sampler(master, [a.base_url, b.base_url]))
            progress = CallProgress(f"{policy}+{router}", swarm.num_calls)
            result = asyncio.run(replay_swarm(swarm, front.base_url, args.model, hints=True,
                                              on_call=progress,
                                              transport=SessionHeaderTransport()))
            metrics = [scrape_metrics(a.base_url), scrape_metrics(b.base_url)]
    except Exception as exc:  # noqa: BLE001 - one failed run still prints the others
        log(f"{policy}+{router}: failed: {type(exc).__name__}: {exc}")
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        return row
    finally:
        if master is not None:
            master.stop()
    ok = result.ok_calls
    ttft = summarize([c.ttft_s for c in ok]) if ok else {}
    peak_source = sampler.master_bytes or sampler.instance_bytes

    def total(name: str, label: str | None = None) -> float:
        """A counter summed over both instances (exposed with the `_total` suffix)."""
        base, _, labels = name.partition("{")
        key = f'{base}_total{{event="{label}"}}' if label else f"{base}_total{{{labels}"
        return sum(m.get(key, 0.0) for m in metrics)

    row.update({
        "calls": len(result.calls), "errors": result.num_errors,
        "first_error": next((c.error for c in result.calls if c.error), None),
        "hit_rate": result.hit_rate, "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "pool_hit_tokens": total('hintkv_prefix_cache_hit_tokens_by_tier{tier="pool"}'),
        "pool_peak_bytes": max(peak_source) if peak_source else None,
        "pool_mean_bytes": sum(peak_source) / len(peak_source) if peak_source else None,
        "instances_peak_bytes": max(sampler.instance_bytes) if sampler.instance_bytes else None,
        "puts": total("hintkv_pool_events", "puts"), "gets": total("hintkv_pool_events", "gets"),
        "dedup": total("hintkv_pool_events", "dedup"),
        "removed": total('hintkv_tier_events{event="removed",tier="pool"}'),
        "evicted": total('hintkv_tier_events{event="evicted",tier="pool"}'),
        "released": total("hintkv_pool_events", "released"),
        "keepalive_calls": total("hintkv_pool_events", "keepalive_calls"),
        "bytes_put": total("hintkv_pool_events", "bytes_put"),
        "bytes_got": total("hintkv_pool_events", "bytes_got"),
        "ttft_mean_s": ttft.get("mean"), "ttft_p90_s": ttft.get("p90"), "wall_s": result.wall_s,
        "working_set_tokens": ws_tokens,
    })
    for key in ("pool_peak", "pool_mean", "instances_peak"):
        v = row.get(f"{key}_bytes")
        row[f"{key}_mib"] = None if v is None else v / 2**20
    log(f"{policy}+{router}: hit rate {row['hit_rate']}, pool peak {row['pool_peak_mib']} MiB")
    return row


class SessionHeaderTransport(httpx.AsyncHTTPTransport):
    """Copies `agent_hint.session_id` / `parent_session_id` into the `x-session-id` /
    `x-parent-session-id` headers: vllm-router's consistent_hash keys on the header (hintkv's
    router and servers read the body; the headers carry the same identity)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            hint = json.loads(request.content).get("agent_hint") or {}
        except (ValueError, AttributeError, httpx.RequestNotRead):
            hint = {}
        if isinstance(hint, dict) and isinstance(hint.get("session_id"), str):
            request.headers["x-session-id"] = hint["session_id"]
            if isinstance(hint.get("parent_session_id"), str):
                request.headers["x-parent-session-id"] = hint["parent_session_id"]
        return await super().handle_async_request(request)


def start_all(stack: contextlib.ExitStack, servers: list[ServerProcess]) -> list[ServerProcess]:
    """Start servers at once (each waits for its own health); all are stopped with `stack`."""
    for s in servers:
        stack.callback(s.stop)
    with ThreadPoolExecutor(len(servers)) as pool:
        for f in [pool.submit(s.start) for s in servers]:
            f.result()
    return servers


def router_spec(router: str, backends: list[str]) -> ServerSpec:
    if router == "hintkv":
        argv = [sys.executable, "-m", "hintkv", "router", "--port", "{port}",
                "--log-level", "warning"]
        for u in backends:
            argv += ["--backend", u]
        return ServerSpec(name="router", argv=argv)
    # vllm-router: session affinity by consistent hashing of the session id; its /health
    # answers once its workers are up
    argv = [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1",
            "--port", "{port}", "--policy", "consistent_hash", "--worker-urls", *backends,
            "--log-level", "warning"]
    return ServerSpec(name="vllm-router", argv=argv, startup_timeout_s=120.0)


if __name__ == "__main__":
    raise SystemExit(main())
