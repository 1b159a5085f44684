"""A/B of the server's event loop and HTTP parser: asyncio + h11 against uvloop + httptools (`--loop`, `--http`).

    PYTHONPATH=. .venv/bin/python scripts/ab_event_loop.py [--rounds 40] [--model SmolLM2-135M-Instruct]

Both servers are up at once (as `bench engine` starts them: float32, OMP threads = CPUs) and idle between
samples; each round takes one cold 128-token TTFT sample (a fresh connection, `max_tokens` 1, as bench engine's
cold row) from each, in ABBA order, after both are at rest (`idle_wait`). Per sample: the client's TTFT, the
server's engine TTFT (`hintkv_metrics.ttft_s`), the rest (outside the engine), the TTFT's parts (the engine's
`ttft_parts`, the server's `serve_parts`, and `wire`: the client's TTFT less the server's `serve_s`: connect,
uvicorn before the handler, the sockets, the client), and the CPU the server's main thread (uvicorn's event
loop) used over the request, from /proc's schedstat (nanoseconds). Prints a table of
medians and B/A ratios, then one JSON line. A benchmark, not a test: compare the ratios, and read the load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics

from hintkv.bench.common import PromptFactory, ServerProcess, hintkv_server
from hintkv.bench.idle_wait import wait_idle
from hintkv.bench.stream_client import stream_completion

SIDES = {"asyncio+h11": ["--loop", "asyncio", "--http", "h11"],
         "uvloop+httptools": ["--loop", "uvloop", "--http", "httptools"]}


def _thread_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:  # the main thread runs the event loop
        return int(f.read().split()[0])


async def _sample(srv: ServerProcess, model: str, prompts: PromptFactory) -> dict[str, float]:
    assert srv.proc is not None
    cpu0 = _thread_cpu_ns(srv.proc.pid)
    t = await stream_completion(srv.base_url, model, prompts.make(128), max_tokens=1)
    cpu = _thread_cpu_ns(srv.proc.pid) - cpu0
    m = t.server_metrics or {}
    parts = {**m.get("ttft_parts", {}), **m.get("serve_parts", {})}
    serve_s = parts.pop("serve_s")
    return {"ttft_ms": t.ttft_s * 1000, "engine_ms": m["ttft_s"] * 1000,
            "outside_ms": (t.ttft_s - m["ttft_s"]) * 1000, "loop_cpu_ms": cpu / 1e6,
            **{k.removesuffix("_s") + "_ms": v * 1000 for k, v in parts.items()},
            "wire_ms": (t.ttft_s - serve_s) * 1000}  # the client's TTFT around the server's handler


async def _run(servers: dict[str, ServerProcess], model: str, rounds: int) -> dict[str, dict[str, list[float]]]:
    prompts = PromptFactory(49152, seed=27)
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in servers}
    pgids = [os.getpgid(s.proc.pid) for s in servers.values() if s.proc is not None]
    for srv in servers.values():  # warm-up: lazy init, allocator growth
        for _ in range(5):
            await _sample(srv, model, prompts)
    names = list(servers)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):  # A B, B A, ...
            await wait_idle(pgids, min_s=0.3, max_s=3.0)
            for key, value in (await _sample(servers[name], model, prompts)).items():
                samples[name].setdefault(key, []).append(value)
    return samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    args = p.parse_args()
    threads = str(os.cpu_count() or 1)
    load0 = os.getloadavg()
    with ServerProcess(hintkv_server(args.model, name="ab-a", env={"OMP_NUM_THREADS": threads},
                                     extra_args=["--log-level", "warning", *SIDES["asyncio+h11"]])) as a, \
         ServerProcess(hintkv_server(args.model, name="ab-b", env={"OMP_NUM_THREADS": threads},
                                     extra_args=["--log-level", "warning", *SIDES["uvloop+httptools"]])) as b:
        samples = asyncio.run(_run(dict(zip(SIDES, (a, b))), args.model, args.rounds))
    load1 = os.getloadavg()
    names = list(SIDES)
    med = {n: {k: statistics.median(v) for k, v in samples[n].items()} for n in names}
    print(f"{'median':<14}" + "".join(f"{n:>18}" for n in names) + f"{'B/A':>8}")
    for key in med[names[0]]:
        a_v, b_v = med[names[0]][key], med[names[1]][key]
        print(f"{key:<14}{a_v:>18.3f}{b_v:>18.3f}" + (f"{b_v / a_v:>8.3f}" if a_v else f"{'-':>8}"))
    print(f"load {load0[0]:.2f} -> {load1[0]:.2f}, {args.rounds} rounds")
    print(json.dumps({"rounds": args.rounds, "load_1m": [load0[0], load1[0]], "median": med,
                      "b_over_a": {k: med[names[1]][k] / med[names[0]][k] if med[names[0]][k] else None
                                   for k in med[names[0]]}}))


if __name__ == "__main__":
    main()
