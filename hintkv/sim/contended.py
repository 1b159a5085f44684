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

A call's least work: its uncached tokens' cold compute at the cheapest per-token rate a step
reaches (`min cold_ms(n) / n` for n up to the budget: a step costs `cold_ms` of ALL its tokens, so
batching small prefills can share a step's flat, launch-bound cost, but no step computes a token
for less than that rate), plus its least attention to what is before each chunk
(`least_attn_ms`). Attention per query token falls with the chunk's size (launch-bound below
2048 tokens on the h200 profiles) and grows with the prefix, so the least is budget-sized chunks
from the cached prefix on, each at the least per-token rate of any chunk the call could take
(`attn_rate_ms`: a chunk of at most min(uncached, budget) tokens). Decodes, loads and the step
overhead are left out (they only add).

Why not more (the fifteenth session's review of this bound, which overstated the floor by 1.8-4%):
- it took the larger of the SRPT mean and the mean of the calls' prefills alone (`sim.bound`), but
  a prefill alone in budget-filling chunks is not a floor for every chunking: `cold()` is convex
  between 2048 and 8192 tokens, so an even split of a tail just above the budget costs up to 3.7%
  less (8192 + 149 on 90,000 cached: 1819.0 ms, 4171 + 4170: 1750.9 ms);
- it priced a call's last chunk at that chunk's own attention rate: 149 tokens after 8192 pay the
  launch-bound rate of a 149-token chunk (4x the 2048-token rate at a 98K prefix), which a split
  into two larger chunks avoids.
So the bound is the SRPT mean alone: a call's work never exceeds what any chunking of the call
costs in any step (tested against every split of a small call).

With several instances, each one's calls (by the run's placement, `CallRecord.instance`) are
served on their own. At the oracle's hits it is a bound for the policies that reach them call by
call (as `sim.bound`: Belady maximizes the total); at compulsory misses (`hits` of an unbounded
cache) for every policy.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence

from hintkv.sim.costs import CostModel


def cheapest_token_ms(costs: CostModel, budget: int) -> float:
    """The least `cold_ms(n) / n` over 1 <= n <= budget (piecewise linear: at a knot or an end)."""
    xs = {1, budget, *(int(x) for x in costs._cold_x if 1 <= x <= budget)}
    return min(costs.cold_ms(n) / n for n in xs)


def attn_rate_ms(costs: CostModel, cached: int, largest: int) -> float:
    """The least attention per query token to a `cached`-token prefix of any chunk of 1 to
    `largest` tokens (`attn_ms` is piecewise linear in the chunk's size, so its per-token rate is
    monotone between the measured sizes: the least is at one of them or an end)."""
    xs = {1, largest, *(n for n in costs._attn_n if 1 <= n <= largest)}
    return min(costs.attn_ms(n, cached) / n for n in xs)


def least_attn_ms(costs: CostModel, prompt_tokens: int, cached: int, budget: int) -> float:
    """At most the attention any chunking of a call's uncached tokens (chunks of at most `budget`)
    pays: budget-sized chunks from the cached prefix on, each token at the least rate of a chunk
    the call could take (module doc). Budget-sized chunks put the least token weight on later
    prefixes (sum of n_i x start_i = (U^2 - sum n_i^2) / 2 for U tokens is least with the most
    full chunks), which is the least attention where the rate grows linearly with the prefix (the
    h200 profiles' nearly do: tests/sim/test_sim_contended.py checks it against every chunking on
    a 64-token grid)."""
    done = min(cached, prompt_tokens - 1)
    largest = min(budget, prompt_tokens - done)
    ms = 0.0
    while done < prompt_tokens:
        n = min(budget, prompt_tokens - done)
        ms += n * attn_rate_ms(costs, done, largest)
        done += n
    return ms


def prefill_work_ms(costs: CostModel, prompt_tokens: int, cached: int, budget: int, rate_ms: float) -> float:
    """The least step time a call's prefill takes up (module doc): its uncached tokens at the
    cheapest cold rate `rate_ms` (`cheapest_token_ms`) plus `least_attn_ms`."""
    new = prompt_tokens - min(cached, prompt_tokens - 1)
    return rate_ms * new + least_attn_ms(costs, prompt_tokens, cached, budget)


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
    """The mean over `calls` (with `sent_s`, `prompt_tokens`, `access`, `instance`) of their SRPT
    flow time on their instance, each call's work at `hits[call.access]` cached tokens (module doc)."""
    calls = [c for c in calls if c.access >= 0]
    if not calls:
        return None
    rate = cheapest_token_ms(costs, budget)
    per: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for c in calls:
        work = prefill_work_ms(costs, c.prompt_tokens, hits[c.access], budget, rate) / 1e3
        per[c.instance].append((c.sent_s, work))
    return sum(sum(srpt_flow_s(jobs)) for jobs in per.values()) / len(calls)


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
