"""The offline half of `hintkv bench swarm`: capacities from the working set, the oracle, sweeps.

Every figure here comes from `hintkv.replay` (the real cache code on a virtual clock) and the
Belady oracle over the same run's block accesses; nothing is typed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from hintkv.replay import OfflineConfig, OfflineResult, belady, belady_pinned, replay_offline
from hintkv.workload.program import Workload

# (name, policy, hints, host tier?, admission) of the compared configurations: lru is vLLM with
# automatic prefix caching (FCFS admission); qlru gets the same cache-aware admission as sam, so
# what the scheduler gives is not credited to hints; lru/ca shows what that admission gives alone.
CONFIGS = (("lru", "lru", False, False, "fcfs"), ("lru+host", "lru", False, True, "fcfs"),
           ("sam", "sam", True, False, "cache-aware"), ("sam+host", "sam", True, True, "cache-aware"),
           ("qlru", "qlru", False, False, "cache-aware"), ("qlru+host", "qlru", False, True, "cache-aware"),
           ("lru/ca", "lru", False, False, "cache-aware"))
ADMISSION = {c[0]: c[4] for c in CONFIGS}
HOST = {c[0]: c[3] for c in CONFIGS}


@dataclass(slots=True)
class Sizing:
    working_set_blocks: int  # peak distinct blocks held by live sessions or running requests
    ideal_hit_rate: float
    max_request_blocks: int  # the largest prompt + completion, in blocks
    prompt_tokens: int
    num_calls: int

    def device_blocks(self, fraction: float) -> int:
        return max(math.ceil(fraction * self.working_set_blocks), self.max_request_blocks + 1)


def size_workload(wl: Workload, base: OfflineConfig, memo: dict) -> Sizing:
    bs = base.block_size
    inf = replay_offline(wl, replace(base, policy="sam", hints=True, device_blocks=unbounded_blocks(wl, bs),
                                     host_blocks=0), memo)
    biggest = max(math.ceil((c.num_prompt_tokens + c.max_tokens) / bs)
                  for t in wl.tasks() for a in t.agents() for c in a.calls)
    return Sizing(inf.peak_held_blocks, belady(inf.accesses, None, bs).hit_rate, biggest, inf.prompt_tokens,
                  len(inf.calls))


def unbounded_blocks(wl: Workload, block_size: int) -> int:
    """A device pool no replay of `wl` can fill: every call's prompt and completion blocks
    (building a pool of 10^7 blocks cost more than the replay itself)."""
    return 1 + sum(math.ceil((c.num_prompt_tokens + c.max_tokens) / block_size) + 1
                   for t in wl.tasks() for a in t.agents() for c in a.calls)


def run_configs(wl: Workload, base: OfflineConfig, device: int, host: int, memo: dict,
                hinted: str = "sam") -> dict[str, dict[str, Any]]:
    """Every configuration of CONFIGS at one capacity, plus the oracles (device, device + host):
    `oracle` is Belady over lru's accesses (it may evict a running request's blocks, which no
    engine can); `oracle/pinned` is `pinned_reference` (the headroom goal's reference:
    docs/benchmarks/history/swarm.md, "Captured headroom's reference"). The main table, the sweep and the grid
    all call this, so a cell's reference never depends on which rows a caller reads. `hinted`:
    the policy of the hinted runs (named `sam`, `sam+host` in the table)."""
    out: dict[str, dict[str, Any]] = {}
    results: dict[str, OfflineResult] = {}
    for name, policy, hints, with_host, admission in CONFIGS:
        policy = hinted if policy == "sam" else policy
        cfg = replace(base, policy=policy, hints=hints, device_blocks=device, host_blocks=host if with_host else 0,
                      scheduling=admission)
        key = ("run", cfg)  # one workload per memo: a configuration asked for twice runs once
        if key not in memo:
            memo[key] = replay_offline(wl, cfg, memo)
        r = results[name] = memo[key]
        out[name] = offline_row(r)
    bs = base.block_size
    out["oracle"] = {"hit_rate": belady(results["lru"].accesses, device, bs).hit_rate}
    out["oracle+host"] = {"hit_rate": belady(results["lru+host"].accesses, device + host, bs).hit_rate}
    out["oracle/pinned"] = pinned_reference(results, device, bs, with_host=False)
    out["oracle+host/pinned"] = pinned_reference(results, device + host, bs, with_host=True)
    out["_device_blocks"], out["_host_blocks"] = device, host
    return out


def pinned_reference(results: dict[str, OfflineResult], capacity: int, block_size: int,
                     with_host: bool) -> dict[str, Any]:
    """The captured-headroom reference at one capacity: the best `belady_pinned` (never evicts a
    running request's blocks, as no engine can, and holds its partial last block as the offline
    replay does: it reserves prompt + max_tokens at admission) over the schedule (own accesses) of EVERY
    configuration of CONFIGS at this tier (device only, or with the host tier), lru/ca included.
    The set is fixed, so the reference does not depend on which runs a caller compares; adding a
    schedule can only raise it. Returns {"hit_rate", "schedule": the configuration whose schedule
    gave it}."""
    names = [c[0] for c in CONFIGS if c[3] == with_host]
    missing = [n for n in names if n not in results]
    if missing:
        raise ValueError(f"pinned reference needs every configuration's schedule; missing {missing}")
    best = max(((belady_pinned(results[n].accesses, capacity, block_size).hit_rate, n) for n in names),
               key=lambda x: x[0])
    return {"hit_rate": best[0], "schedule": best[1]}


def bound_violations(runs: dict[str, dict[str, Any]], where: str) -> list[str]:
    """Every configuration of one cell (`run_configs`) above its tier's pinned reference: then the
    pinned oracle is not a bound there (`swarm_goals.headroom_reference` falls back)."""
    bad = []
    for name, _, _, with_host, _ in CONFIGS:
        ref = "oracle+host/pinned" if with_host else "oracle/pinned"
        got, pin = runs.get(name, {}).get("hit_rate"), runs.get(ref, {}).get("hit_rate")
        if pin is None or (got is not None and got > pin + 1e-9):
            bad.append(f"{name} at {where}: {got} > pinned {pin}")
    return bad


def offline_row(r: OfflineResult) -> dict[str, Any]:
    ttft = sorted(c.ttft_s for c in r.calls)
    return {
        "hit_rate": r.hit_rate,
        "host_hit_rate": r.host_hit_tokens / r.prompt_tokens if r.prompt_tokens else 0.0,
        "prompt_tokens": r.prompt_tokens,
        "hit_tokens": r.hit_tokens,
        "recomputed_tokens": r.recomputed_tokens,
        "peak_host_blocks": r.peak_host_blocks,
        "mean_host_blocks": r.mean_host_blocks,
        "host_written_blocks": r.host_written,
        "host_loaded_blocks": r.host_loaded,
        "unservable": r.num_unservable,
        "model_ttft_mean_s": sum(ttft) / len(ttft) if ttft else None,
        "host_samples": r.host_samples,
    }


def captured(hinted: float, lru: float, oracle: float) -> float | None:
    """(hints - lru) / (oracle - lru); None when the oracle gains nothing."""
    gain = oracle - lru
    return (hinted - lru) / gain if gain > 1e-9 else None
