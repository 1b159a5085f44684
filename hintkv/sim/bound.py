"""What a call's time to first token comes to with nothing but its own prefill: the TTFT bound.

    prefill_alone_s(costs, prompt_tokens=105_000, cached=98_000, budget=8192)   # seconds
    ttft_bound_s(costs, accesses, capacity_blocks, block_size, budget)          # mean over calls

A call's first token needs its uncached tokens computed (at least one: the last prompt token
always is), in chunks of at most the step's token budget, each chunk attending to everything
before it. `prefill_alone_s` is that cost on an instance doing nothing else, chunked as the
engine chunks when only the budget limits it (full-budget chunks, then the rest): each chunk is a
step of its own (`CostModel.step_ms`, no decode or other prefill beside it). A real step that
also runs other sequences costs at least as much (the cost model adds every other token's cold
and attention cost and every decode's KV read), and queueing, loading and blocking only add.

`ttft_bound_s` takes each call's hits from Belady's oracle at a capacity (`replay.belady`, the
call's access in the given order): at the oracle+host capacity it is the TTFT goal's `ceiling`,
each call served alone at the hits the best policy with those tiers reaches. (The report takes it
in `sim.oracles.OracleBook`: `bound_at_hits_s` at the hits of one shared index's Belady passes;
`ttft_bound_s` is the one-order form the tests use.) `capacity_blocks`
None gives the compulsory misses only (an unbounded cache). (At a finite capacity the oracle
maximizes the total hits; a policy could in principle trade another call's hits for a costlier
call's, which the compulsory figure rules out.)

Both are a bound for the engine's budget-filling chunking, on this access order; not for every
chunking or order:
- Chunking: `cold()` is convex between 2048 and 8192 tokens on both H200 profiles and the step
  overhead is 0, so an even split can cost less. 8341 uncached tokens on 90,000 cached (8b):
  8192 + 149 alone take 1819.0 ms, 4171 + 4170 take 1750.9 ms (3.7% lower; 70b: 3.6%). The
  engine splits a tail below the budget only when something else fills the step (room), and
  that step costs cold(total) >= cold(chunk).
- Order: the hits come from one access order (the best oracle schedule's); sessions sharing
  prefixes in another order get other compulsory hits (the eleventh session's review found no
  effect on `--quick --seed 0`: the six runs' own orders all gave 0.1516 s).
"""

from __future__ import annotations

from collections.abc import Sequence

from hintkv.replay import belady
from hintkv.sim.costs import CostModel


def prefill_alone_s(costs: CostModel, prompt_tokens: int, cached: int, budget: int) -> float:
    """Seconds to compute a prompt's uncached tail alone, in `budget`-token chunks."""
    done = min(cached, prompt_tokens - 1)
    ms = 0.0
    while done < prompt_tokens:
        n = min(budget, prompt_tokens - done)
        ms += costs.step_ms([(n, done)])
        done += n
    return ms / 1e3


def mean_prefill_alone_s(costs: CostModel, calls: Sequence, budget: int) -> float | None:
    """Mean over calls (anything with `prompt_tokens`, `cached_tokens`) of `prefill_alone_s` at
    each call's own hits: the part of a run's TTFT its own prefill alone explains."""
    xs = [prefill_alone_s(costs, c.prompt_tokens, c.cached_tokens, budget) for c in calls]
    return sum(xs) / len(xs) if xs else None


def ttft_bound_s(costs: CostModel, accesses: Sequence, capacity_blocks: int | None, block_size: int,
                 budget: int) -> float | None:
    """Mean TTFT with each call's prefill alone at Belady's hits for `accesses` at the capacity."""
    if not accesses:
        return None
    return bound_at_hits_s(costs, accesses, belady(accesses, capacity_blocks, block_size).access_hit_tokens,
                           budget)


def bound_at_hits_s(costs: CostModel, accesses: Sequence, hits: Sequence[int], budget: int) -> float | None:
    """Mean TTFT with each call's prefill alone at the given hits (one per access, in order)."""
    if not accesses:
        return None
    return sum(prefill_alone_s(costs, a.prompt_tokens, h, budget)
               for a, h in zip(accesses, hits, strict=True)) / len(accesses)


def alone_rows(costs: CostModel, results: dict, budget: int) -> list[dict]:
    """Per run, where the mean TTFT goes with its own prefill alone split out: `alone_s` (its
    uncached tokens at its own hits, alone on the instance), `beside_s` (the rest of its time in
    forward steps: the decodes and other prefills batched beside it), and the waits."""
    rows = []
    for name, r in results.items():
        calls = [c for c in r.calls if c.ttft_s is not None and c.ttft_parts]
        if not calls:
            continue
        n = len(calls)
        part = {k: sum(c.ttft_parts[k] for c in calls) / n for k in ("queue_s", "load_s", "blocked_s")}
        in_steps = sum(c.ttft_parts["compute_s"] + c.ttft_parts["shared_s"] for c in calls) / n
        alone = mean_prefill_alone_s(costs, calls, budget)
        rows.append({"run": name, "ttft_mean_s": sum(c.ttft_s for c in calls) / n, "alone_s": alone,
                     "beside_s": in_steps - alone, **part})
    return rows
