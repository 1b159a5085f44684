"""`hintkv bench swarm`'s live runs measured in interleaved rounds: medians, with the spread.

    pace = shared_pace(urls, wl, args, offline_pace)         # one time scale for every run
    rounds = run_rounds(servers, wl, args, bpb, pace["time_scale"], n)
    live = {name: median_row(rows) for name, rows in rounds.rows.items()}

One live run per configuration was decided by the machine, not the policies: within one quiet
seventh-session run the server's measured slowdown against the offline model ranged 1.66-3.47x
from run to run (the machine's speed state during each ~15 s replay), and dividing each run by its
own slowdown did not undo it. So, as `bench engine` does: every server is up, then round after
round every configuration replays the same workload once (`workload.rounds.workload_round`: a
copy whose token ids and session ids are new, so nothing a previous round cached is hit), in an
order rotated each round, so each configuration meets the same machine states. Every run in
every round keeps one pace: each server's speed is measured once before the first round and the
trace's times are divided by the offline pace over the median slowdown (`--live-pace measured`),
so every configuration replays an equally contended swarm. A live row is the median of its
rounds (calls and errors summed); `per_round` keeps each round's figures, and the timed goals
(`swarm_goals._timed`) are reductions of medians, with the per-round reductions beside them.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field
from typing import Any

from hintkv.bench.common import log, median
from hintkv.bench.swarm_live import run_live, server_slowdown
from hintkv.bench.swarm_pace import Speed
from hintkv.workload.live import LiveResult
from hintkv.workload.rounds import workload_round

SUMMED = ("calls", "errors")
PER_ROUND = ("hit_rate", "ttft_mean_s", "ttft_p99_s", "e2e_task_mean_s", "preemptions", "queue_mean")


@dataclass(slots=True)
class Rounds:
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # run -> one row per round
    results: dict[str, list[LiveResult]] = field(default_factory=dict)  # run -> one replay per round
    order: list[list[str]] = field(default_factory=list)  # the runs of each round, in the order replayed


def shared_pace(urls: dict[str, str], wl, args: argparse.Namespace,
                offline_pace: tuple[float, Speed]) -> dict[str, Any]:
    """The live time scale every run keeps: the offline one over the servers' median slowdown
    (`--live-pace measured`), or the offline one as is (`fixed`)."""
    scale, model_speed = offline_pace
    if args.live_pace != "measured" or not urls:
        return {"time_scale": scale, "slowdown": None, "slowdowns": {}}
    slow = {}
    for name, url in urls.items():
        try:
            slow[name] = asyncio.run(server_slowdown(url, wl, args, model_speed))
        except Exception as exc:  # noqa: BLE001 - that server's runs record their own error
            log(f"{name}: speed not measured: {type(exc).__name__}: {exc}")
    if not slow:
        return {"time_scale": scale, "slowdown": None, "slowdowns": {}}
    sd = median(slow.values())
    log("pace: server slowdowns " + ", ".join(f"{k} {v:.2f}x" for k, v in slow.items())
        + f"; median {sd:.2f}x -> live time scale {scale / sd:.3g}")
    return {"time_scale": scale / sd, "slowdown": sd, "slowdowns": slow}


def rotated(names: list[str], r: int) -> list[str]:
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def run_rounds(servers: dict[str, tuple[str, bool]], wl, args: argparse.Namespace, bpb: int,
               time_scale: float, rounds: int, vocab: int = 49152) -> Rounds:
    """`rounds` rounds; in each, every server of `servers` ({run: (url, hints)}) replays round r's
    copy of `wl` once, in an order rotated by r."""
    out = Rounds()
    names = list(servers)
    for r in range(rounds):
        wl_r = workload_round(wl, r, vocab)
        out.order.append(rotated(names, r))
        for name in out.order[-1]:
            url, hints = servers[name]
            row, result = run_live(f"{name} (round {r + 1}/{rounds})", wl_r, args, hints, url, bpb, time_scale)
            out.rows.setdefault(name, []).append({"round": r, **row})
            out.results.setdefault(name, []).append(result)
    return out


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One live row from a run's rounds: each figure's median over the rounds that ran (calls and
    errors summed), `rounds` (how many ran), `per_round` (each round's key figures) and the first
    error; a run whose every round failed gives its first error row."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return {k: v for k, v in rows[0].items() if k != "round"} if rows else {"error": "no rounds"}
    out: dict[str, Any] = {}
    for k in ok[0]:
        vals = [r.get(k) for r in ok]
        if k in SUMMED:
            out[k] = sum(v for v in vals if _is_num(v))
        elif k != "round" and all(_is_num(v) for v in vals):
            out[k] = median(vals)
    out["first_error"] = next((r.get("first_error") for r in rows if r.get("first_error")), None)
    out["rounds"] = len(ok)
    out["failed_rounds"] = len(rows) - len(ok)
    out["per_round"] = {k: [r.get(k) for r in rows] for k in PER_ROUND}
    return out


def spread(values: list[Any]) -> str | None:
    """min-max of a per-round list (None entries left out)."""
    xs = [v for v in values if _is_num(v)]
    return f"{min(xs):.3g}-{max(xs):.3g}" if xs else None


def round_table(rounds: Rounds) -> list[dict[str, Any]]:
    """One row per replay, in the order replayed: what the medians are made of."""
    out = []
    for r, names in enumerate(rounds.order):
        for pos, name in enumerate(names):
            row = rounds.rows[name][r]
            out.append({"round": r + 1, "order": pos + 1, "run": name, "error": row.get("error"),
                        **{k: row.get(k) for k in PER_ROUND}, "wall_s": row.get("wall_s")})
    return out


ROUND_COLUMNS = ["round", "order", "run", *PER_ROUND, "wall_s", "error"]
