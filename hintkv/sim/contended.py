"""The TTFT bound with the prefills that must overlap: one instance computes one step at a time.

    contended_bound_s(costs, calls, hits, budget)   # mean s per call: SRPT over the calls' work, or their floors alone
    contended_bounds(costs, results, book, budget)  # the report's: the hinted run's arrivals
    alone_srpt_s(costs, calls, hits, budget)        # SRPT over each call's prefill alone: NOT a bound

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
reaches (`CostModel.least_cold_rate_ms` up to the budget: a step costs `cold_ms` of ALL its tokens,
so batching small prefills can share a step's flat, launch-bound cost, but no step computes a token
for less than that rate), plus `least_attn_ms`. Decodes, loads and the step overhead are left out
(they only add).

The SRPT mean prices every token at the cheapest batched rate, which no call reaches alone. So
the bound is the larger of it and the mean of the calls' `least_alone_ms`: a step holding a chunk
of n tokens costs at least `cold(n)` plus its attention (`cold` never decreases with the step's
tokens), so a call's TTFT is at least its cheapest chunking's cost as if alone. Not the engine's
budget-filling chunks (`sim.bound`): `cold` is convex, so an even split can cost less.

With several instances, each one's calls (by the run's placement, `CallRecord.instance`) are
served on their own. At the oracle's hits it is a bound for the policies that reach them call by
call (as `sim.bound`: Belady maximizes the total); at compulsory misses (`hits` of an unbounded
cache) for every policy, on these arrivals (the agents are closed-loop: another policy or
scheduler sends at other times).

`alone_srpt_s` prices each call at its prefill alone in the engine's budget-filling chunks
(`sim.bound.prefill_alone_s`) instead: the mean of the SRPT schedule of that work. It is NOT a
bound: steps that batch prefills share `cold`'s flat, launch-bound cost. Two 200-token cold calls
sent together take 9.0 ms each alone (SRPT over that work: 13.5 ms mean) and 11.25 ms together in
one step (tests/sim/test_sim_contended.py). It is the least mean TTFT of the schedules that charge
every call at least its own chunks alone, so the gap between it and `contended_bound_s` is what
batching prefills (and cheaper chunkings) could still take.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence

from hintkv.sim.bound import prefill_alone_s
from hintkv.sim.costs import CostModel


def least_attn_ms(costs: CostModel, prompt_tokens: int, cached: int, budget: int) -> float:
    """The least attention to what is before each chunk that a chunking of a call's uncached
    tokens (chunks of at most `budget`) pays, each token at the least rate of any chunk the call
    could take (`CostModel.least_attn_rate_ms`) at its chunk's start. Over budget-sized chunks and
    one shorter one, the short one at its best position.

    Assumption (tested, not proven): no other chunking pays less. Where the rate is linear in the
    prefix, every order of the same chunks pays the same and the most full chunks the least
    (sum of n_i x start_i = (U^2 - sum n_i^2) / 2 for U tokens); where it bends upward (8192 and
    32768 cached on the h200 profiles) a short chunk before the bend can pay less than one at the
    end, so every position is tried. tests/sim/test_sim_contended.py checks it against every
    chunking on a token grid (dynamic programming) on both h200 profiles."""
    done = min(cached, prompt_tokens - 1)
    new = prompt_tokens - done
    largest = min(budget, new)
    full, short = divmod(new, budget)
    before = [costs.least_attn_rate_ms(done + i * budget, largest) for i in range(full + 1)]
    if not short:
        return budget * sum(before[:full])
    after = [costs.least_attn_rate_ms(done + short + i * budget, largest) for i in range(full)]
    # the short chunk after `at` full chunks: full ones start at done + i x budget before it,
    # at done + short + i x budget after it
    head, tail, best = 0.0, budget * sum(after), float("inf")
    for at in range(full + 1):
        best = min(best, head + short * before[at] + tail)
        head += budget * before[at]
        if at < full:
            tail -= budget * after[at]
    return best


def least_alone_ms(costs: CostModel, prompt_tokens: int, cached: int, budget: int) -> float:
    """A floor on a call's prefill in any steps whatever runs beside it (module doc): its
    cheapest chunking's cold compute plus `least_attn_ms`. `cold` is convex from 1 token on
    (flat below the first measured size, then slopes that do not fall: tested on the profiles), so
    for k chunks an even split costs the least, and its cost is convex in k: stop when it rises."""
    new = prompt_tokens - min(cached, prompt_tokens - 1)

    def even(k: int) -> float:
        q, r = divmod(new, k)
        return r * costs.cold_ms(q + 1) + (k - r) * costs.cold_ms(q)

    k = -(-new // budget)
    cold = even(k)
    while k < new and (nxt := even(k + 1)) < cold:
        k, cold = k + 1, nxt
    return cold + least_attn_ms(costs, prompt_tokens, cached, budget)


def prefill_work_ms(costs: CostModel, prompt_tokens: int, cached: int, budget: int, rate_ms: float) -> float:
    """The least step time a call's prefill takes up (module doc): its uncached tokens at the
    cheapest cold rate `rate_ms` (`CostModel.least_cold_rate_ms`) plus `least_attn_ms`."""
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
    """The larger of: the mean over `calls` (with `sent_s`, `prompt_tokens`, `access`, `instance`)
    of their SRPT flow time on their instance, and the mean of their `least_alone_ms`; each call at
    `hits[call.access]` cached tokens (module doc)."""
    calls = [c for c in calls if c.access >= 0]
    if not calls:
        return None
    rate = costs.least_cold_rate_ms(budget)
    per: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for c in calls:
        work = prefill_work_ms(costs, c.prompt_tokens, hits[c.access], budget, rate) / 1e3
        per[c.instance].append((c.sent_s, work))
    srpt = sum(sum(srpt_flow_s(jobs)) for jobs in per.values()) / len(calls)
    alone = sum(least_alone_ms(costs, c.prompt_tokens, hits[c.access], budget) for c in calls) / 1e3 / len(calls)
    return max(srpt, alone)


def alone_srpt_s(costs: CostModel, calls: Sequence, hits: Sequence[int], budget: int) -> float | None:
    """The mean SRPT flow time per instance with each call's work its prefill alone at
    `hits[call.access]` (module doc: not a bound for schedules that batch prefills)."""
    calls = [c for c in calls if c.access >= 0]
    if not calls:
        return None
    per: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for c in calls:
        per[c.instance].append((c.sent_s, prefill_alone_s(costs, c.prompt_tokens, hits[c.access], budget)))
    return sum(sum(srpt_flow_s(jobs)) for jobs in per.values()) / len(calls)


HINTED = ("sam+hints+pool", "sam+hints+host")  # whose arrivals the report's contended bound takes


def contended_bounds(costs: CostModel, results: dict, book, budget: int) -> dict:
    """The report's contended bounds (JSON `ttft_bounds`): on the hinted run's own arrivals and
    access order, at the bound tier's Belady hits (`contended_s`) and at compulsory misses
    (`contended_compulsory_s`), and `alone_srpt_s` at the bound tier's hits (not a bound);
    {} when the hinted run or the bound tier's oracle did not run."""
    run = next((n for n in HINTED if n in results and n in book.own_hits), None)
    if run is None:
        return {}
    calls = results[run].calls
    return {"contended_run": run,
            "contended_s": contended_bound_s(costs, calls, book.own_hits[run], budget),
            "contended_compulsory_s": contended_bound_s(costs, calls, book.own_compulsory[run], budget),
            "alone_srpt_s": alone_srpt_s(costs, calls, book.own_hits[run], budget)}
