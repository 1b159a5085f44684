"""The TTFT bound with the prefills that must overlap: one instance computes one step at a time.

    contended_bound_s(costs, calls, hits, budget)   # mean s per call: SRPT over the calls' work
    contended_bounds(costs, results, book, budget)  # the report's: the hinted run's arrivals

`sim.bound` serves every call alone at the oracle's hits. But calls arrive while others prefill,
and an instance's steps run one after another: their prefill work is serialized whatever the
scheduler does. Here each call arrives when the run sent it (the hinted run's own send times: the
same workload, arrivals as that run produced them) with the least work its prefill can cost in
any step (`prefill_work_ms`), and the instance serves the work by shortest remaining work first,
preempting: for one server with release times that order gives the least mean flow time of any
schedule, batched or not (L. Schrage, Operations Research 16(3), 1968; processor sharing is one such schedule). A
call's first token comes no earlier than its work's completion there, so the mean of
`completion - sent` bounds the mean TTFT of any scheduler on this run's arrivals at these hits.

A call's least work: its uncached tokens in budget-sized chunks (the chunking that minimizes the
model's attention: its attention to the prefix is linear in the query tokens, so a finer split
only moves tokens later, onto a longer prefix), each chunk costing its attention to what is
before it (`CostModel.attn_ms`) plus its tokens at the cheapest per-token rate a step reaches
(`min cold_ms(n) / n` for n up to the budget: a step costs `cold_ms` of ALL its tokens, so
batching small prefills can share a step's flat, launch-bound cost, but no step computes a token
for less than that rate). Decodes, loads and the step overhead are left out (they only add).

Each call's own prefill alone (`sim.bound`) is a floor too, call by call (a step holding its chunk
costs at least `cold_ms` of that chunk plus its attention), so the bound is the larger of the two
means: the SRPT mean is below it where the calls' tails are short and the cheapest rate far under
a small chunk's launch-bound cost (`--quick`: 0.1453 vs 0.1516 s), above it where prefills pile up.

With several instances, each one's calls (by the run's placement, `CallRecord.instance`) are
served on their own. At the oracle's hits it is a bound for the policies that reach them call by
call (as `sim.bound`: Belady maximizes the total); at compulsory misses (`hits` of an unbounded
cache) for every policy.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence

from hintkv.sim.bound import prefill_alone_s
from hintkv.sim.costs import CostModel


def cheapest_token_ms(costs: CostModel, budget: int) -> float:
    """The least `cold_ms(n) / n` over 1 <= n <= budget (piecewise linear: at a knot or an end)."""
    xs = {1, budget, *(int(x) for x in costs._cold_x if 1 <= x <= budget)}
    return min(costs.cold_ms(n) / n for n in xs)


def prefill_work_ms(costs: CostModel, prompt_tokens: int, cached: int, budget: int, rate_ms: float) -> float:
    """The least step time a call's prefill takes up, in budget-sized chunks (module doc)."""
    done = min(cached, prompt_tokens - 1)
    ms = 0.0
    while done < prompt_tokens:
        n = min(budget, prompt_tokens - done)
        ms += rate_ms * n + costs.attn_ms(n, done)
        done += n
    return ms


def srpt_flow_s(jobs: Sequence[tuple[float, float]]) -> list[float]:
    """Flow times (completion - release) of (release_s, work_s) jobs on one server, shortest
    remaining work first with preemption, in the jobs' order."""
    order = sorted(range(len(jobs)), key=lambda j: jobs[j][0])
    flow = [0.0] * len(jobs)
    heap: list[tuple[float, int]] = []  # (remaining work, job)
    now, k = 0.0, 0
    while k < len(order) or heap:
        if not heap:
            now = max(now, jobs[order[k]][0])
        while k < len(order) and jobs[order[k]][0] <= now:
            heapq.heappush(heap, (jobs[order[k]][1], order[k]))
            k += 1
        left, j = heapq.heappop(heap)
        until = jobs[order[k]][0] if k < len(order) else float("inf")
        if now + left <= until:
            now += left
            flow[j] = now - jobs[j][0]
        else:  # the next release may preempt it: run until then and look again
            heapq.heappush(heap, (left - (until - now), j))
            now = until
    return flow


def contended_bound_s(costs: CostModel, calls: Sequence, hits: Sequence[int], budget: int) -> float | None:
    """The larger of: the mean over `calls` (with `sent_s`, `prompt_tokens`, `access`, `instance`)
    of their SRPT flow time on their instance, each call's work at `hits[call.access]` cached
    tokens; and the mean of their prefills alone at those hits (module doc)."""
    calls = [c for c in calls if c.access >= 0]
    if not calls:
        return None
    rate = cheapest_token_ms(costs, budget)
    per: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for c in calls:
        work = prefill_work_ms(costs, c.prompt_tokens, hits[c.access], budget, rate) / 1e3
        per[c.instance].append((c.sent_s, work))
    srpt = sum(sum(srpt_flow_s(jobs)) for jobs in per.values()) / len(calls)
    alone = sum(prefill_alone_s(costs, c.prompt_tokens, hits[c.access], budget) for c in calls) / len(calls)
    return max(srpt, alone)


HINTED = ("sam+hints+pool", "sam+hints+host")  # whose arrivals the report's contended bound takes


def contended_bounds(costs: CostModel, results: dict, book, budget: int) -> dict:
    """The report's contended bounds (JSON `ttft_bounds`): on the hinted run's own arrivals and
    access order, at the bound tier's Belady hits (`contended_s`) and at compulsory misses
    (`contended_compulsory_s`); {} when the hinted run or the bound tier's oracle did not run."""
    run = next((n for n in HINTED if n in results and n in book.own_hits), None)
    if run is None:
        return {}
    calls = results[run].calls
    return {"contended_run": run,
            "contended_s": contended_bound_s(costs, calls, book.own_hits[run], budget),
            "contended_compulsory_s": contended_bound_s(costs, calls, book.own_compulsory[run], budget)}
