"""`hintkv bench overload`: a swarm at 2x and 5x the rate the server sustains.

    hintkv bench overload --quick        # 8 s per phase (about 2 minutes in all)
    hintkv bench overload                # 30 s per phase

A `hintkv serve --model dummy:tiny` subprocess with a small queue (`--max-queued-requests`)
first runs a closed loop (as many clients as it has slots) to find the sustainable rate R;
then requests arrive open-loop at 2R and 5R while a management client sends an evict hint
every 50 ms. Every request uses one of a few token-id prompts whose greedy output was recorded
first, so each answer is checked: a 200 must carry exactly that output, a refusal must be a
429/503 with Retry-After; anything else (an error, a wrong output, no answer) is lost. Memory
is the server's RSS after the closed loop and again after the load ends.

Latencies are measured twice: by the load generator (hundreds of requests in flight on one
event loop, so its numbers include its own loop's delay) and by a probe in a process of its
own (`overload_probe`: a management request every 50 ms, a generation request every 200 ms,
refused while the server is full). The goals use the probe; the server's own histograms
(`hintkv_agent_hint_manage_seconds`, `hintkv_refusal_seconds`: arrival to reply / refusal)
are printed too, so a miss can be told apart: server work, or a client or CPU starved.

Goals (issue 12): 0 lost or wrong responses; every refusal answered with 429/503 + Retry-After
within 50 ms (the probe's); management p99 < 10 ms while inference is saturated (the probe's);
memory flat (RSS after the load within 10% of before). A table, then one JSON line with `goals`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field

import httpx

from hintkv.bench.common import (
    ServerProcess,
    add_common_args,
    emit_json,
    goal_at_most,
    hintkv_server,
    log,
    percentile,
    print_table,
)
from hintkv.bench.overload_probe import Probe

MAX_TOKENS = 8
NUM_PROMPTS = 6
SLOTS = 8
MANAGE_HISTOGRAM = "hintkv_agent_hint_manage_seconds"
REFUSE_HISTOGRAM = "hintkv_refusal_seconds"


@dataclass
class Phase:
    name: str
    offered_rps: float | None = None
    ok: int = 0
    refused: int = 0
    lost: int = 0
    wrong: int = 0
    refusals_without_retry_after: int = 0
    refuse_ms: list[float] = field(default_factory=list)
    ok_ms: list[float] = field(default_factory=list)
    manage_ms: list[float] = field(default_factory=list)  # the probe's
    probe_refuse_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0


def _buckets(base: str, name: str) -> dict[float, float]:
    """One of the server's own latency histograms (cumulative count per upper bound, s)."""
    text = httpx.get(base + "/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.split()[-1])
    return out


def _bucket_p99_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The upper bound (ms) of the bucket holding the 99th percentile of what came in between."""
    diff = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = diff[-1][1] if diff else 0
    if total <= 0:
        return None
    return next(le * 1000 for le, n in diff if n >= 0.99 * total)


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


async def _complete(client: httpx.AsyncClient, prompt: list[int]) -> httpx.Response:
    return await client.post("/v1/completions", json={
        "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True})


async def _one(client: httpx.AsyncClient, prompts, expected, phase: Phase, i: int) -> None:
    k = i % len(prompts)
    t0 = time.perf_counter()
    try:
        r = await _complete(client, prompts[k])
    except httpx.HTTPError:
        phase.lost += 1
        return
    ms = (time.perf_counter() - t0) * 1000
    if r.status_code == 200:
        phase.ok += 1
        phase.ok_ms.append(ms)
        if r.json()["choices"][0]["token_ids"] != expected[k]:
            phase.wrong += 1
    elif r.status_code in (429, 503):
        phase.refused += 1
        phase.refuse_ms.append(ms)
        if "retry-after" not in r.headers:
            phase.refusals_without_retry_after += 1
    else:
        phase.lost += 1


async def _closed_loop(base: str, prompts, expected, seconds: float) -> Phase:
    phase = Phase("sustained (closed loop)")
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        deadline = time.perf_counter() + seconds
        counter = iter(range(10**9))

        async def worker() -> None:
            while time.perf_counter() < deadline:
                await _one(client, prompts, expected, phase, next(counter))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(SLOTS)))
        phase.seconds = time.perf_counter() - t0
    return phase


async def _open_loop(base: str, prompts, expected, rps: float, seconds: float, name: str,
                     seed: int) -> Phase:
    phase = Phase(name, offered_rps=rps)
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    probe = Probe(base, seconds).start()
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        tasks = []
        t0 = time.perf_counter()
        next_at, i = t0, 0
        while next_at < t0 + seconds:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            tasks.append(asyncio.create_task(_one(client, prompts, expected, phase, i)))
            i += 1
            next_at += rng.expovariate(rps)
        await asyncio.gather(*tasks)
        phase.seconds = time.perf_counter() - t0
    seen = await probe.result()
    phase.manage_ms, phase.probe_refuse_ms = seen["manage_ms"], seen["refuse_ms"]
    phase.lost += seen["lost"]
    phase.refusals_without_retry_after += seen["refusals_without_retry_after"]
    return phase


def _row(p: Phase) -> dict:
    done = p.ok + p.refused + p.lost
    return {
        "phase": p.name, "offered_rps": p.offered_rps,
        "served_rps": p.ok / p.seconds if p.seconds else None,
        "requests": done, "ok": p.ok, "refused": p.refused, "lost": p.lost, "wrong": p.wrong,
        "ok_p50_ms": percentile(p.ok_ms, 50) if p.ok_ms else None,
        "load_refuse_p99_ms": percentile(p.refuse_ms, 99) if p.refuse_ms else None,
        "probe_refusals": len(p.probe_refuse_ms),
        "refuse_p99_ms": percentile(p.probe_refuse_ms, 99) if p.probe_refuse_ms else None,
        "refuse_max_ms": max(p.probe_refuse_ms) if p.probe_refuse_ms else None,
        "manage_p50_ms": percentile(p.manage_ms, 50) if p.manage_ms else None,
        "manage_p99_ms": percentile(p.manage_ms, 99) if p.manage_ms else None,
    }


async def _run(args: argparse.Namespace) -> dict:
    seconds = 8.0 if args.quick else 30.0
    flags = ["--kv-cache-tokens", "4096", "--max-model-len", "512", "--max-num-seqs", str(SLOTS),
             "--max-queued-requests", str(args.queue), "--dtype", "float32", "--device", "cpu",
             "--log-level", "warning", "--seed", str(args.seed)]
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(100, 40000) for _ in range(24)] for _ in range(NUM_PROMPTS)]
    with ServerProcess(hintkv_server("dummy:tiny", name="overload", extra_args=flags)) as srv:
        assert srv.proc is not None
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as c:
            expected = [(await _complete(c, p)).json()["choices"][0]["token_ids"] for p in prompts]
        log("closed loop: finding the sustainable rate")
        sustained = await _closed_loop(srv.base_url, prompts, expected, seconds)
        rate = sustained.ok / sustained.seconds
        rss_before = _rss_bytes(srv.proc.pid)
        manage_before = _buckets(srv.base_url, MANAGE_HISTOGRAM)
        refuse_before = _buckets(srv.base_url, REFUSE_HISTOGRAM)
        phases = [sustained]
        for factor in (2, 5):
            log(f"open loop at {factor}x = {factor * rate:.1f} requests/s")
            phases.append(await _open_loop(srv.base_url, prompts, expected, factor * rate,
                                           seconds, f"{factor}x", args.seed + factor))
        server_p99 = _bucket_p99_ms(manage_before, _buckets(srv.base_url, MANAGE_HISTOGRAM))
        server_refuse_p99 = _bucket_p99_ms(refuse_before, _buckets(srv.base_url, REFUSE_HISTOGRAM))
        await asyncio.sleep(3.0)
        rss_after = _rss_bytes(srv.proc.pid)
    return {"phases": phases, "sustained_rps": rate, "rss_before": rss_before,
            "rss_after": rss_after, "server_manage_p99_bucket_ms": server_p99,
            "server_refuse_p99_bucket_ms": server_refuse_p99}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hintkv bench overload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--queue", type=int, default=8, help="--max-queued-requests of the server")
    args = p.parse_args(argv)
    out = asyncio.run(_run(args))
    rows = [_row(ph) for ph in out["phases"]]
    print_table(rows, ["phase", "offered_rps", "served_rps", "requests", "ok", "refused", "lost",
                       "wrong", "ok_p50_ms", "load_refuse_p99_ms", "probe_refusals",
                       "refuse_p99_ms", "refuse_max_ms", "manage_p50_ms", "manage_p99_ms"])
    over = [ph for ph in out["phases"] if ph.offered_rps is not None]
    lost_or_wrong = sum(ph.lost + ph.wrong for ph in out["phases"])
    refuse_ms = [x for ph in over for x in ph.probe_refuse_ms]
    no_retry = sum(ph.refusals_without_retry_after for ph in over)
    manage_ms = [x for ph in over for x in ph.manage_ms]
    before, after = out["rss_before"], out["rss_after"]
    growth = (after - before) / before if before and after else None
    print(f"server RSS: {before / 2**20:.0f} MiB after the closed loop, "
          f"{after / 2**20:.0f} MiB after the load" if before and after else "RSS unknown")
    refuse_max = max(refuse_ms) if refuse_ms else None
    print(f"inside the server (p99, histogram bucket bound): management <= "
          f"{out['server_manage_p99_bucket_ms']} ms, refusal <= {out['server_refuse_p99_bucket_ms']} ms")
    emit_json({
        "bench": "overload",
        "quick": args.quick,
        "sustained_rps": out["sustained_rps"],
        "results": rows,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "server_manage_p99_bucket_ms": out["server_manage_p99_bucket_ms"],
        "server_refuse_p99_bucket_ms": out["server_refuse_p99_bucket_ms"],
        "goals": {
            "lost_or_wrong_responses": goal_at_most(0, lost_or_wrong),
            "refusals_without_retry_after": goal_at_most(0, no_retry),
            "refusal_max_ms": goal_at_most(50, refuse_max),
            "management_p99_ms": goal_at_most(10, percentile(manage_ms, 99) if manage_ms else None),
            "rss_growth_after_load": goal_at_most(0.10, growth),
        },
    })
    return 0
