"""`hintkv bench fuzz`: hypothesis-built hostile requests against the real server app.

    hintkv bench fuzz --quick                    # 1,000 cases (seconds)
    hintkv bench fuzz                            # 100,000 cases, the issue's goal (~20-30 min)
    hintkv bench fuzz --transport http --cases 2000   # through a `hintkv serve` subprocess
    hintkv bench fuzz --cases-seed N             # the cases of a run that printed seed N, again

Default transport `asgi`: the real FastAPI app (`build_app`) around a real `AsyncLLM` on
dummy:tiny with `debug_integrity` (the cache's integrity checked after every engine step), driven
in this process through `httpx.ASGITransport`, its lifespan (session sweeps, periodic integrity
check) running. Every route, middleware, limit and engine call is the server's own; only the
socket and uvicorn's HTTP parsing are skipped, which makes it ~9x faster than `http` (a
`hintkv serve` subprocess behind uvicorn, ~10 cases/s here), so 100,000 cases fit in well under
an hour on 2 cores.

Requests are built by `hintkv.bench.fuzz_cases` (bodies, every agent_hint field, headers,
paths). Counted: answers by class (2xx / 4xx / 5xx), contract breaks (a 4xx without the OpenAI
error shape), crashes (no answer, an exception out of the app, or the server died), internal
errors and integrity violations from `/metrics`, KV blocks still in use at the end, and whether a
good request is still served at the end. A table, then one JSON line with `goals`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed

from hintkv.bench.common import (
    ServerProcess,
    add_common_args,
    emit_json,
    goal_at_least,
    goal_at_most,
    hintkv_server,
    log,
    print_table,
)
from hintkv.bench.fuzz_cases import Case, answer_problem, cases

API_KEY = "bench-fuzz-key"
GOAL_CASES = 100_000
AUTH = {"authorization": f"Bearer {API_KEY}"}

# (method, path, headers, body) -> response; raises httpx.HTTPError (or anything) on no answer
Send = Callable[[str, str, dict[str, str | bytes], bytes], httpx.Response]


class Target:
    """Where the cases go: `send` one request, `alive()`, `blocks_in_use()` (None: not visible)."""

    def __init__(self, send: Send, alive: Callable[[], bool],
                 blocks_in_use: Callable[[], int | None]) -> None:
        self.send = send
        self.alive = alive
        self.blocks_in_use = blocks_in_use


@contextmanager
def asgi_target(seed: int) -> Iterator[Target]:
    """The real app and engine in this process; one event loop runs every request."""
    from hintkv.config import EngineConfig
    from hintkv.engine.async_llm import AsyncLLM
    from hintkv.server import build_app

    engine = AsyncLLM.from_config(EngineConfig(
        model="dummy:tiny", dtype="float32", device="cpu", kv_cache_tokens=2048,
        max_model_len=512, max_num_seqs=8, debug_integrity=True, seed=seed))
    app = build_app(engine, [API_KEY])
    loop = asyncio.new_event_loop()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fuzz",
                               timeout=60)
    lifespan = app.router.lifespan_context(app)
    loop.run_until_complete(lifespan.__aenter__())
    try:
        def send(method: str, path: str, headers: dict[str, str | bytes], body: bytes) -> httpx.Response:
            return loop.run_until_complete(
                client.request(method, path, headers=headers, content=body))

        yield Target(send, lambda: True, lambda: engine.stats().kv_blocks_in_use)
    finally:
        loop.run_until_complete(lifespan.__aexit__(None, None, None))
        loop.run_until_complete(client.aclose())
        loop.run_until_complete(engine.shutdown())
        loop.close()


@contextmanager
def http_target(seed: int) -> Iterator[Target]:
    """A `hintkv serve` subprocess behind uvicorn, over loopback HTTP."""
    args = ["--api-key", API_KEY, "--kv-cache-tokens", "2048", "--max-model-len", "512",
            "--max-num-seqs", "8", "--dtype", "float32", "--device", "cpu", "--debug-integrity",
            "--seed", str(seed)]
    with ServerProcess(hintkv_server("dummy:tiny", name="fuzz", extra_args=args)) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=60) as client:
        def send(method: str, path: str, headers: dict[str, str | bytes], body: bytes) -> httpx.Response:
            return client.request(method, path, headers=headers, content=body)

        yield Target(send, lambda: srv.proc is not None and srv.proc.poll() is None,
                     lambda: None)


TARGETS = {"asgi": asgi_target, "http": http_target}


def _metric(target: Target, name: str) -> float | None:
    try:
        text = target.send("GET", "/metrics", AUTH, b"").text
    except Exception:  # noqa: BLE001 - a dead server has no metrics; its crash is counted
        return None
    line = next((x for x in text.splitlines() if x.startswith(name + " ")), None)
    return float(line.split()[-1]) if line else None


def run(num_cases: int, seed: int, transport: str = "asgi", cases_seed: int | None = None) -> dict[str, Any]:
    """`seed`: the engine's; `cases_seed`: hypothesis's (None: a new one, logged and returned, so a run's
    failure reproduces with `--cases-seed`)."""
    if cases_seed is None:
        cases_seed = random.SystemRandom().randrange(2**32)
    log(f"cases from seed {cases_seed} (--cases-seed {cases_seed} draws them again)")
    counts: collections.Counter[str] = collections.Counter()
    examples: list[str] = []
    t0 = time.perf_counter()
    with TARGETS[transport](seed) as target:

        @hypothesis_seed(cases_seed)
        @settings(max_examples=num_cases, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=cases(API_KEY))
        def one(case: Case) -> None:
            counts["cases"] += 1
            try:
                r = target.send(case.method, case.path, case.headers, case.body)
            except Exception as exc:  # noqa: BLE001 - no answer at all: counted as a crash
                counts["crashes"] += 1
                if len(examples) < 5:
                    examples.append(f"no answer to {case.method} {case.path}: {exc!r}")
                return
            counts[f"{r.status_code // 100}xx"] += 1
            problem = answer_problem(r.status_code, r.headers.get("content-type", ""), r.content)
            if problem is not None:
                counts["contract_breaks"] += 1
                if len(examples) < 5:
                    examples.append(f"{case.method} {case.path} {case.headers} {case.body[:200]!r}: {problem}")
            if counts["cases"] % 5000 == 0:
                rate = counts["cases"] / (time.perf_counter() - t0)
                log(f"{counts['cases']} cases ({rate:.1f}/s): {dict(counts)}")

        one()
        alive = target.alive()
        try:
            good = target.send("POST", "/v1/completions", AUTH, (
                b'{"prompt": "still here", "max_tokens": 2, "temperature": 0}'))
            served_after = good.status_code == 200
        except Exception:  # noqa: BLE001 - no answer: not served
            served_after = False
        internal = _metric(target, "hintkv_internal_errors_total")
        violations = _metric(target, "hintkv_integrity_violations_total")
        blocks_left = target.blocks_in_use()
    if not alive:
        counts["crashes"] += 1
    for line in examples:
        log(line)
    return {
        "transport": transport, "cases_seed": cases_seed, "cases": counts["cases"], "2xx": counts["2xx"],
        "4xx": counts["4xx"], "5xx": counts["5xx"], "contract_breaks": counts["contract_breaks"],
        "crashes": counts["crashes"], "internal_errors": internal,
        "integrity_violations": violations, "blocks_left": blocks_left,
        "served_after": served_after, "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hintkv bench fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--cases", type=int, default=None,
                   help=f"requests to try (default {GOAL_CASES:,}; --quick: 1,000)")
    p.add_argument("--cases-seed", type=int, default=None,
                   help="hypothesis's seed (default: a new one each run, printed): a failing run's cases again")
    p.add_argument("--transport", choices=sorted(TARGETS), default="asgi",
                   help="asgi: the real app in-process (default); http: a server subprocess")
    args = p.parse_args(argv)
    num_cases = args.cases or (1000 if args.quick else GOAL_CASES)
    row = run(num_cases, args.seed, args.transport, args.cases_seed)
    row["cases_per_s"] = row["cases"] / row["seconds"] if row["seconds"] else None
    print_table([row], ["transport", "cases", "2xx", "4xx", "5xx", "contract_breaks", "crashes",
                        "internal_errors", "integrity_violations", "blocks_left", "served_after",
                        "cases_per_s"])
    crashes = row["crashes"] + (0 if row["served_after"] else 1)
    emit_json({
        "bench": "fuzz",
        "quick": args.quick,
        "results": row,
        "goals": {
            "cases": goal_at_least(GOAL_CASES, row["cases"]),
            "5xx": goal_at_most(0, row["5xx"]),
            "crashes": goal_at_most(0, crashes),
            "integrity_violations": goal_at_most(0, row["integrity_violations"]),
        },
    })
    return 0
