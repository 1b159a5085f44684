"""`hintkv bench fuzz`: hypothesis-built hostile requests against a real server process.

    hintkv bench fuzz --quick            # 1,000 cases (about a minute on 2 cores)
    hintkv bench fuzz --cases 100000     # the issue's goal (hours on a busy 2-core machine)

A `hintkv serve --model dummy:tiny` subprocess (with an API key and --debug-integrity, so the
cache's integrity is checked after every engine step) gets `--cases` requests built by
`hintkv.bench.fuzz_cases` (bodies, every agent_hint field, headers, paths). Counted: answers by
class (2xx / 4xx / 5xx), contract breaks (a 4xx without the OpenAI error shape), crashes (no
answer, or the process died), internal errors and integrity violations from `/metrics`, and
whether a good request is still served at the end. A table, then one JSON line with `goals`.
"""

from __future__ import annotations

import argparse
import collections
import time

import httpx
from hypothesis import HealthCheck, given, settings

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


def _metric(client: httpx.Client, name: str) -> float | None:
    try:
        text = client.get("/metrics", headers={"authorization": f"Bearer {API_KEY}"}).text
    except httpx.HTTPError:
        return None
    line = next((x for x in text.splitlines() if x.startswith(name + " ")), None)
    return float(line.split()[-1]) if line else None


def run(num_cases: int, seed: int) -> dict:
    counts: collections.Counter[str] = collections.Counter()
    examples: list[str] = []
    args = ["--api-key", API_KEY, "--kv-cache-tokens", "2048", "--max-model-len", "512",
            "--max-num-seqs", "8", "--dtype", "float32", "--device", "cpu", "--debug-integrity",
            "--seed", str(seed)]
    t0 = time.perf_counter()
    with ServerProcess(hintkv_server("dummy:tiny", name="fuzz", extra_args=args)) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=60) as client:

        @settings(max_examples=num_cases, deadline=None, database=None, derandomize=False,
                  suppress_health_check=list(HealthCheck))
        @given(case=cases(API_KEY))
        def one(case: Case) -> None:
            counts["cases"] += 1
            try:
                r = client.request(case.method, case.path, headers=case.headers, content=case.body)
            except httpx.HTTPError as exc:
                counts["crashes"] += 1
                examples.append(f"no answer to {case.method} {case.path}: {exc!r}")
                return
            counts[f"{r.status_code // 100}xx"] += 1
            problem = answer_problem(r.status_code, r.headers.get("content-type", ""), r.content)
            if problem is not None:
                counts["contract_breaks"] += 1
                if len(examples) < 5:
                    examples.append(f"{case.method} {case.path} {case.body[:200]!r}: {problem}")
            if counts["cases"] % 1000 == 0:
                log(f"{counts['cases']} cases: {dict(counts)}")

        one()
        alive = srv.proc is not None and srv.proc.poll() is None
        good = client.post("/v1/completions", headers={"authorization": f"Bearer {API_KEY}"},
                           json={"prompt": "still here", "max_tokens": 2, "temperature": 0})
        internal = _metric(client, "hintkv_internal_errors_total")
        violations = _metric(client, "hintkv_integrity_violations_total")
    if not alive:
        counts["crashes"] += 1
    for line in examples:
        log(line)
    return {
        "cases": counts["cases"], "2xx": counts["2xx"], "4xx": counts["4xx"],
        "5xx": counts["5xx"], "contract_breaks": counts["contract_breaks"],
        "crashes": counts["crashes"], "internal_errors": internal,
        "integrity_violations": violations, "served_after": good.status_code == 200,
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hintkv bench fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--cases", type=int, default=None,
                   help=f"requests to try (default {GOAL_CASES:,}; --quick: 1,000)")
    args = p.parse_args(argv)
    num_cases = args.cases or (1000 if args.quick else GOAL_CASES)
    row = run(num_cases, args.seed)
    row["cases_per_s"] = row["cases"] / row["seconds"] if row["seconds"] else None
    print_table([row], ["cases", "2xx", "4xx", "5xx", "contract_breaks", "crashes",
                        "internal_errors", "integrity_violations", "served_after", "cases_per_s"])
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
