"""The live half of `hintkv bench swarm`: one `hintkv serve` per run, the replay over HTTP, its row.

Each run's server is launched early (they start up while the offline part runs) and all are
waited for until healthy before the first replay (a server still starting up, loading and
warming its model, slowed the run being measured: a quiet seventh-session run measured sam+host
3.0x slower than the model while two servers started). `swarm_rounds.py` then measures every
server's speed (`server_slowdown`, `swarm_pace.measure_speed`) for one shared pace and replays
the runs in interleaved rounds; `run_live` is one replay of one round on one server.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx

from hintkv.bench.common import (
    CallProgress,
    ServerProcess,
    hintkv_server,
    log,
    summarize,
)
from hintkv.bench.sessions import parse_metrics
from hintkv.bench.swarm_pace import Speed, measure_speed, slowdown
from hintkv.workload.agent import HintPlan
from hintkv.workload.live import LiveResult, replay_live

# (name, eviction policy, hints, host tier?)
LIVE = (("lru", "lru", False, False), ("lru+host", "lru", False, True), ("sam", "sam", True, False),
        ("sam+host", "sam", True, True), ("qlru+host", "qlru", False, True),
        ("lru+host/pf", "lru", False, True), ("lru+host/sf", "lru", False, True),
        ("sam+host/fair", "sam", True, True), ("sam+host/sf", "sam", True, True),
        ("lru+host/ss", "lru", False, True), ("sam+host/ss", "sam", True, True),
        ("sam+host/watch", "sam", True, True), ("lru+host/ja", "lru", False, True), ("sam+host/ja", "sam", True, True),
        ("sam+host/fine", "sam", True, True), ("sam+host/fine-watch", "sam", True, True))
HINTED_ADMISSION = "prefill-judged"  # the hinted runs' scheduler (and qlru+host's, lru+host/pf's)
LIVE_ADMISSION = {"lru": "fcfs", "lru+host": "fcfs", "sam": HINTED_ADMISSION, "sam+host": HINTED_ADMISSION,
                  "qlru+host": HINTED_ADMISSION, "lru+host/pf": HINTED_ADMISSION,
                  "lru+host/sf": "short-first", "sam+host/fair": "prefill-fair",
                  "sam+host/sf": "short-first", "lru+host/ss": "fcfs",
                  "sam+host/ss": HINTED_ADMISSION, "sam+host/watch": HINTED_ADMISSION,
                  "lru+host/ja": "judged-alone", "sam+host/ja": "judged-alone",
                  "sam+host/fine": HINTED_ADMISSION, "sam+host/fine-watch": HINTED_ADMISSION}  # offline: ADMISSION
# the /ja rows: `judged-alone` (engine/admission_alone.py), engine-only, so lru+host/ja shows what it gives alone
# the /ss rows: their run with the opt-in `--load-timing same-step` (a host hit computes in the step its
# load starts; every other run: the engine's default `next-step`, engine/load_timing.py). A row's own
# arguments come after `--server-arg`, so no `--server-arg` can turn a /ss row back.
# the /watch row: SAM's predicted-resume prefetch keeps looking until the call arrives (the opt-in
# `--resume-prefetch watch`, cache/resume_prefetch.py), against sam+host's default `once`
# the /fine row: sam+host with sam's bands cut finer (`--eviction-policy sam-fine`, cache/policies/sam_fine.py);
# /fine-watch: that and the resume watch (a session due sooner than others now has room ranked below it)
LIVE_SERVER_ARGS = {"lru+host/ss": ["--load-timing", "same-step"], "sam+host/ss": ["--load-timing", "same-step"],
                    "sam+host/watch": ["--resume-prefetch", "watch"], "sam+host/fine": ["--eviction-policy", "sam-fine"],
                    "sam+host/fine-watch": ["--eviction-policy", "sam-fine", "--resume-prefetch", "watch"]}
DEFAULT_RUNS = ("lru", "lru+host", "sam", "sam+host", "qlru+host", "lru+host/pf")


def admission_of(name: str, server_args: list[str]) -> str:
    """The admission a live run's server runs: its default, or a `--server-arg
    --scheduling-policy X` that overrides it (the table's `admission` column)."""
    for i, a in enumerate(server_args):
        if a.startswith("--scheduling-policy="):
            return a.split("=", 1)[1]
        if a == "--scheduling-policy" and i + 1 < len(server_args):
            return server_args[i + 1]
    return LIVE_ADMISSION[name]


def block_bytes(model: str, block_size: int) -> int:
    from hintkv.models.presets import preset_config

    try:
        cfg = preset_config(model.split(":", 1)[1] if model.startswith("dummy:") else "smollm2-135m")
    except (KeyError, ValueError):
        cfg = preset_config("smollm2-135m")
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4 * block_size


def vocab_size(model: str) -> int:
    """The model's vocabulary (round copies map token ids inside it); SmolLM2's for real models."""
    from hintkv.models.presets import preset_config

    try:
        return preset_config(model.split(":", 1)[1] if model.startswith("dummy:") else "smollm2-135m").vocab_size
    except (KeyError, ValueError):
        return preset_config("smollm2-135m").vocab_size


def launch_servers(args: argparse.Namespace, device: int, host: int, bpb: int,
                   out: dict[str, tuple[ServerProcess, bool]]) -> None:
    """One `hintkv serve` per chosen live run, launched (not waited for) so they start up together."""
    chosen = set(args.runs.split(","))
    for name, policy, hints, with_host in LIVE:
        if name not in chosen:
            continue
        server = ["--kv-cache-tokens", str(device * args.block_size), "--block-size", str(args.block_size),
                  "--eviction-policy", args.policy if policy == "sam" else policy,
                  "--scheduling-policy", LIVE_ADMISSION[name],
                  *([] if hints else ["--ignore-hints"]),
                  *(["--host-cache-memory", str(host * bpb)] if with_host else []),
                  *(["--offload-mode", args.hinted_offload_mode, "--host-mode", args.hinted_host_mode]
                    if with_host and hints else []), *args.server_arg, *LIVE_SERVER_ARGS.get(name, [])]
        out[name] = (ServerProcess(hintkv_server(args.model, name=f"swarm-{name.replace('/', '-')}", extra_args=server)).launch(), hints)


def run_live(name: str, wl, args: argparse.Namespace, hints: bool, url: str, bpb: int,
             time_scale: float) -> tuple[dict[str, Any], LiveResult]:
    """Replay `wl` against the server at `url` with the trace's times divided by `time_scale`;
    (its row, the replay). A failed run gives an `error` row (the other runs still print)."""
    progress = CallProgress(name, wl.num_calls)
    try:
        result, samples = asyncio.run(_replay(wl, url, args, hints, time_scale, progress))
    except Exception as exc:  # noqa: BLE001 - one failed run still prints the others and unmet goals
        log(f"{name}: failed: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}, LiveResult(hints)
    row = {"time_scale": time_scale, **live_row(result, samples, bpb)}
    log(f"{name}: hit rate {row['hit_rate']}, mean TTFT {row['ttft_mean_s']}, wall {result.wall_s:.0f}s")
    return row, result


def live_time_scale(wl, offline_scale: float, model_speed: Speed, measured: Speed) -> tuple[float, float]:
    """(live time scale, slowdown): the offline time scale kept at the offline model's serving time
    : tool time ratio on a server measured at `measured` (slowdown: its serving time / the model's)."""
    sd = slowdown(wl, model_speed, measured)
    return offline_scale / sd, sd


async def server_slowdown(url: str, wl, args: argparse.Namespace, model_speed: Speed) -> float:
    """The server's serving time for `wl` over the offline model's, measured now."""
    return slowdown(wl, model_speed, await measure_speed(url, args.model, seed=args.seed))


async def _replay(wl, url: str, args: argparse.Namespace, hints: bool, time_scale: float,
                  progress) -> tuple[LiveResult, list]:
    samples: list[tuple[float, dict[str, float]]] = []
    done = asyncio.Event()

    async def sample() -> None:
        async with httpx.AsyncClient(timeout=5.0) as c:
            t0 = time.perf_counter()
            while not done.is_set():
                try:
                    samples.append((time.perf_counter() - t0, parse_metrics((await c.get(url + "/metrics")).text)))
                except httpx.HTTPError:
                    pass
                try:
                    await asyncio.wait_for(done.wait(), 0.5)
                except TimeoutError:
                    pass
            try:
                samples.append((time.perf_counter() - t0, parse_metrics((await c.get(url + "/metrics")).text)))
            except httpx.HTTPError:
                pass

    sampler = asyncio.create_task(sample())
    try:
        result = await replay_live(wl, url, args.model, HintPlan(hints=hints), time_scale=time_scale,
                                   on_call=progress)
    finally:
        done.set()
        await sampler
    return result, samples


def by_label(metrics: dict[str, float], name: str) -> dict[str, float]:
    """One metric's series by their first label value: `name{tier="host"} 5` -> {"host": 5}.
    Counters are exposed as `name_total`; `_created` series are not values."""
    out: dict[str, float] = {}
    for series, v in metrics.items():
        base, _, labels = series.partition("{")
        if base in (name, name + "_total") and labels:
            out[labels.split('"')[1]] = out.get(labels.split('"')[1], 0.0) + v
    return out


def live_row(r: LiveResult, samples: list, bpb: int) -> dict[str, Any]:
    ok = [c for c in r.calls if c.ok]
    ttft = summarize([c.ttft_s for c in ok]) if ok else {}
    host = [by_label(m, "hintkv_tier_blocks").get("host", 0.0) for _, m in samples]
    # counters as the replay's own: the first sample is taken after the speed probe
    first, last = (samples[0][1], samples[-1][1]) if samples else ({}, {})
    since = {k: v - first.get(k, 0.0) for k, v in last.items()}
    tiers = by_label(since, "hintkv_prefix_cache_hit_tokens_by_tier")
    moved = sum(by_label(since, "hintkv_tier_bytes_moved").values())
    queue = [m["hintkv_num_requests_waiting"] for _, m in samples if "hintkv_num_requests_waiting" in m]
    prompt = r.prompt_tokens
    return {
        "calls": len(r.calls), "errors": r.num_errors,
        "first_error": next((c.error for c in r.calls if c.error), None),
        "prompt_tokens": prompt, "cached_tokens": r.cached_tokens, "hit_rate": r.hit_rate,
        "host_hit_rate": (tiers.get("host", 0.0) / prompt) if prompt and tiers else None,
        "hit_tokens_by_tier": tiers,
        "recomputed_tokens": prompt - r.cached_tokens,
        # why TTFT differs at one hit rate: prompt tokens the model ran (recomputes after a
        # preemption included), preemptions, and how many requests waited (sampled twice a second)
        "computed_tokens": since.get("hintkv_prompt_tokens_computed_total"),
        "preemptions": since.get("hintkv_num_preemptions_total"),
        "queue_mean": sum(queue) / len(queue) if queue else None,
        "load_wait_s": since.get("hintkv_tier_load_wait_seconds_total"),
        "ttft_mean_s": ttft.get("mean"), "ttft_p50_s": ttft.get("p50"), "ttft_p90_s": ttft.get("p90"),
        "ttft_p99_s": ttft.get("p99"),
        "e2e_call_mean_s": sum(c.e2e_s for c in ok) / len(ok) if ok else None,
        "e2e_task_mean_s": sum(r.task_s.values()) / len(r.task_s) if r.task_s else None,
        "peak_host_mib": max(host, default=0.0) * bpb / 2**20,
        "mean_host_mib": (sum(host) / len(host) if host else 0.0) * bpb / 2**20,
        "moved_mib": moved / 2**20,
        "actions": {k: {"sent": v[0], "ok": v[1]} for k, v in r.actions.items()},
        "wall_s": r.wall_s,
    }


