"""The TTFT bound with the prefills that must overlap: one instance computes one step at a time.

    contended_bound_s(costs, calls, hits, budget)   # mean s per call: per busy period, SRPT over the calls' work or their floors alone
    chunk_floors_ms(costs, prompt_tokens, cached, budget)  # (alone, work): a call's floors over every chunking
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

A call's work (`chunk_floors_ms`, twenty-sixth session): the least share of the steps its chunks
run in, over every chunking. A step of T tokens costs at least cold(T) plus each chunk's attention;
a chunk of n tokens takes n x cold(T) / T of the cold part, at least n x the least cold rate of a
step of n to budget tokens (`CostModel.least_cold_rate_ms(budget, n)`). So only chunks under the
cheapest size (512 tokens on the h200 profiles) share a launch-bound cost; a chunk above it pays
its own cold rate however many tokens are batched beside it (`cold` is convex there). The
attention is priced with the same chunk sizes (a line under the per-token attention, module
`chunk_floors_ms`). The older work, `prefill_work_ms` (every token at the least cold rate, every
chunk at the least attention rate: two chunk sizes no chunking has at once), is a floor too, and
the larger of the two is taken. Decodes, loads and the step overhead are left out (they only add).

The SRPT flows still price short calls at a batched rate that no call reaches alone. A call's
floor alone (`chunk_floors_ms`' alone: cold(n) for each chunk instead of its share) holds for
each call: a step holding a chunk of n tokens costs at least `cold(n)` plus its attention. The
bound is per busy period of the SRPT server (the calls that overlap), the larger of the period's
SRPT flows and its calls' floors alone: a set of calls has at least the SRPT flows of that set
alone, and at least its floors, so a sum over disjoint sets of either is a floor (before: the
larger of the two means over all calls, 0.75581 s on the whole set's srpt-swap arrivals at 10
users; per period with these floors 0.76677).

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
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

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


GRID = 64  # chunk sizes at which `_RateTable` reads a cold rate (bounded by its ends between them)
BLOCK = 256  # tokens one step of `_overshoot_ms` covers


class _RateTable:
    """A floor on `rate(n) - k x n / 2` over 1 <= n <= top (`chunk_floors_ms`): on each interval
    [a, b] of a grid of chunk sizes (every GRID tokens and every bend of `cold`), `rate` is above
    the lesser of its ends (it is monotone there) and `k x n / 2` below `k x b / 2` (k >= 0)."""

    def __init__(self, rate, budget: int, bends: Sequence[float]) -> None:
        self.rate = rate
        xs = sorted({1, budget, *range(GRID, budget, GRID), *(int(x) for x in bends if 1 < x < budget)})
        ys = [rate(x) for x in xs]
        self.xs = np.array(xs[1:], dtype=float)  # each interval's right end
        self.lo = np.minimum(ys[:-1], ys[1:])
        self._x = xs

    def least(self, top: int, k: float) -> float:
        i = bisect_right(self._x, top) - 1  # intervals wholly at or below `top`: the first i
        out = self.rate(top) - k * top / 2  # (top 1: the only size)
        if i > 0:
            out = min(out, float(np.min(self.lo[:i] - k * self.xs[:i] / 2)))
        if self._x[i] < top:  # the part of the next interval up to `top`
            out = min(out, self.rate(self._x[i]) - k * top / 2)
        return out


def _overshoot_ms(line, rho, brk, d: int, end: int, budget: int) -> float:
    """An upper bound on sum over chunks of n x (line(s) - rho(s))+, s a chunk's start, over every
    split of [d, end) into chunks of at most `budget` tokens: a token t pays at most the largest
    excess over the starts its chunk could have, [max(d, t - budget + 1), t]. `rho` and `line` are
    linear between the bends `brk`, so the excess's largest value on a span is at a bend or an end."""
    g = np.arange(d, end, BLOCK, dtype=float)
    g = np.append(g, float(end))
    k, a = line
    ex = a + k * g - rho(g)
    cell = np.maximum(ex[:-1], ex[1:])  # cell j: [g_j, g_j+1]
    inner = [b for b in brk if d < b < end]
    if inner:
        bx = np.array(inner, dtype=float)
        np.maximum.at(cell, ((bx - d) // BLOCK).astype(int), a + k * bx - rho(bx))
    if cell.max() <= 0:
        return 0.0
    w = -(-(budget - 1) // BLOCK)  # cells back to the earliest start of a chunk holding a token of this one
    padded = np.concatenate([np.full(w, -np.inf), cell])
    window = np.lib.stride_tricks.sliding_window_view(padded, w + 1).max(axis=1)
    tokens = np.diff(g)
    return float(np.sum(tokens * np.maximum(window, 0.0)))


def chunk_floors_ms(costs: CostModel, prompt_tokens: int, cached: int, budget: int,
                    tables: tuple[_RateTable, _RateTable] | None = None) -> tuple[float, float]:
    """Floors on a call's prefill over EVERY chunking (chunks of at most `budget` tokens), each
    chunk priced as `CostModel.step_ms` prices it inside any step: (alone, work).

    `alone`: a step holding a chunk of n tokens at a prefix s costs at least cold(n) + attn(n, s)
    (the call's TTFT is at least the sum over its chunks). `work`: the call's share of those steps,
    n x cold(T) / T + attn(n, s) for a step of T tokens, at least n x the least cold rate of a step of
    n to `budget` tokens (`least_cold_rate_ms(budget, n)`; the shares of a step's calls sum to at
    most its cost). Unlike `least_alone_ms` and `prefill_work_ms`, the attention is priced with the
    chunk sizes that the cold part is priced at:

    attn(n, s) >= n x rho(s), rho(s) = attn(m, s) / m for m = min(budget, uncached) >= n (a token's
    attention never costs more in a larger chunk: tested on the profiles). For any line
    a + k x s, sum over chunks of n x rho(s) >= sum n (a + k s) - the overshoot where the line is
    above rho (`_overshoot_ms`), and over chunks tiling [d, d + U), sum n x s = d U + (U^2 - sum n^2) / 2.
    So a chunking costs at least sum over chunks of (f(n) - k n^2 / 2) + a U + k (d U + U^2 / 2)
    - overshoot, and sum f(n) - k n^2 / 2 >= U x the least of f(n) / n - k n / 2 (`_RateTable`).
    Each line gives a floor; the lines are rho's own segments over [d, end], as they are and lowered
    under rho, and the flat one at rho(d). Each result is also at least the older floor (`least_alone_ms`,
    `prefill_work_ms`). The chunking tests check both against every split on a token grid.
    ValueError on a profile without the premises above (`CostModel.non_monotone`)."""
    if costs.non_monotone:
        raise ValueError(f"no chunking floor on profile {costs.profile.name!r}: {costs.non_monotone}")
    d = min(cached, prompt_tokens - 1)
    new = prompt_tokens - d
    m = min(budget, new)
    alone_t, work_t = tables or rate_tables(costs, budget)
    brk = costs.attn_breaks()
    pts = np.array(sorted({d, prompt_tokens, *(b for b in brk if d < b < prompt_tokens)}), dtype=float)
    ys = np.array([costs.attn_ms(m, int(x)) / m for x in pts])

    def rho(x):  # linear between the bends, so interpolation through them is exact
        return np.interp(x, pts, ys)

    lines = {(0.0, float(ys[0]))}
    for i in range(len(pts) - 1):
        k = max(0.0, (ys[i + 1] - ys[i]) / (pts[i + 1] - pts[i]))
        lines.add((k, float(ys[i] - k * pts[i])))
        lines.add((k, float(np.min(ys - k * pts))))
    alone = work = 0.0
    for k, a in lines:
        attn = a * new + k * (d * new + new * new / 2) - _overshoot_ms((k, a), rho, brk, d, prompt_tokens, budget)
        alone = max(alone, new * alone_t.least(m, k) + attn)
        work = max(work, new * work_t.least(m, k) + attn)
    return (float(max(alone, least_alone_ms(costs, prompt_tokens, cached, budget))),
            float(max(work, prefill_work_ms(costs, prompt_tokens, cached, budget, costs.least_cold_rate_ms(budget)))))


def rate_tables(costs: CostModel, budget: int) -> tuple[_RateTable, _RateTable]:
    """`chunk_floors_ms`'s cold rates by chunk size: alone (cold(n) / n) and in a shared step
    (the least cold rate of a step of n to `budget` tokens)."""
    bends = costs._cold_x
    return (_RateTable(lambda n: costs.cold_ms(n) / n, budget, bends),
            _RateTable(lambda n: costs.least_cold_rate_ms(budget, n), budget, bends))


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


def busy_periods(jobs: Sequence[tuple[float, float, float]]) -> list[list[tuple[float, float, float]]]:
    """(release_s, work_s, ...) jobs sorted by release, grouped into the busy periods of one server
    that works whenever a job is there: a period ends when the work released so far is done."""
    out: list[list] = []
    end = -float("inf")
    for j in jobs:
        if not out or j[0] >= end:
            out.append([])
            end = j[0]
        out[-1].append(j)
        end = max(end, j[0]) + j[1]
    return out


def contended_bound_s(costs: CostModel, calls: Sequence, hits: Sequence[int], budget: int,
                      memo: dict | None = None) -> float | None:
    """A floor on the mean TTFT of `calls` (with `sent_s`, `prompt_tokens`, `access`, `instance`),
    each at `hits[call.access]` cached tokens (module doc): per instance, per busy period of the
    server over the calls' work (`chunk_floors_ms`' work), the larger of the period's SRPT flow
    times and the sum of its calls' floors alone. Any subset's flow times are at least its SRPT
    flows (the others only take the server away) and at least its floors, so a sum over disjoint
    groups of the larger of the two is a floor; over busy periods the SRPT flows add up to the
    whole instance's. None on a profile whose costs the floors cannot take (`CostModel.non_monotone`).
    `memo`: (prompt tokens, hits) -> floors, to share between calls on several runs' arrivals."""
    calls = [c for c in calls if c.access >= 0]
    if not calls or costs.non_monotone:
        return None
    tables = rate_tables(costs, budget)
    memo = {} if memo is None else memo
    per: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for c in calls:
        key = (c.prompt_tokens, hits[c.access])
        if key not in memo:
            memo[key] = chunk_floors_ms(costs, *key, budget, tables)
        alone, work = memo[key]
        per[c.instance].append((c.sent_s, work / 1e3, alone / 1e3))
    total = 0.0
    for jobs in per.values():
        jobs.sort()
        for period in busy_periods(jobs):
            total += max(sum(srpt_flow_s([(r, w) for r, w, _ in period])), sum(a for _, _, a in period))
    return total / len(calls)


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
    {} when the hinted run or the bound tier's oracle did not run. `bound_over_arrivals`: the
    compulsory one on each run's own arrivals and access order (the agents are closed-loop: each
    schedule sends at its own times; a run is never under its own), run name -> s."""
    run = next((n for n in HINTED if n in results and n in book.own_hits), None)
    if run is None:
        return {}
    calls, memo = results[run].calls, {}
    return {"contended_run": run, "contended_none_why": costs.non_monotone,
            "contended_s": contended_bound_s(costs, calls, book.own_hits[run], budget, memo),
            "contended_compulsory_s": contended_bound_s(costs, calls, book.own_compulsory[run], budget, memo),
            "alone_srpt_s": alone_srpt_s(costs, calls, book.own_hits[run], budget),
            "bound_over_arrivals": {n: contended_bound_s(costs, results[n].calls, hits, budget, memo)
                                    for n, hits in book.own_compulsory.items() if n in results}}
