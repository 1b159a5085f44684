"""Where each run's TTFT exceeds the TTFT bound, call by call (the report's "gap to the bound").

    rows = gap_rows(costs, results, book.own_hits, budget)

The bound (`sim.bound`) serves each call alone at Belady's hits. Here every call of a run is set
against its own bound on the run's OWN access order (Belady at the bound tier's capacity,
`OracleBook.own_hits`), and its excess `ttft - bound` is split into parts that sum to it:

- `hits_s`: its own prefill alone at its own hits minus alone at the oracle's (the hits the
  policy missed; negative where it hit more on this call than Belady's total-maximizing choice);
- `beside_s`: the rest of its forward steps' time (decodes and other prefills batched with it);
- `queue_s`, `load_s`, `blocked_s`: the scheduler's waits (`engine.ttft`).

`top10_share` is the share of the run's summed positive excess that its worst 10% of calls
carry, `over_1s` the calls whose excess is over a second: whether the gap is a tail or spread.
`worst_calls` (`hintkv sim --worst-calls N`, off by default) names the calls that carry it: each
run's N largest excesses, one row a call with its parts, in seconds (not per call of the run).
"""

from __future__ import annotations

from hintkv.sim.bound import prefill_alone_s
from hintkv.sim.costs import CostModel

PARTS = ("hits_s", "beside_s", "queue_s", "load_s", "blocked_s")


def call_gap(costs: CostModel, call, oracle_hit: int, budget: int) -> dict[str, float]:
    """One call's bound and its excess over it, in parts."""
    p = call.ttft_parts
    bound = prefill_alone_s(costs, call.prompt_tokens, oracle_hit, budget)
    alone = prefill_alone_s(costs, call.prompt_tokens, call.cached_tokens, budget)
    return {"bound_s": bound, "hits_s": alone - bound,
            "beside_s": p["compute_s"] + p["shared_s"] - alone,
            "queue_s": p["queue_s"], "load_s": p["load_s"], "blocked_s": p["blocked_s"],
            "excess_s": call.ttft_s - bound}


def gap_rows(costs: CostModel, results: dict, own_hits: dict[str, tuple[int, ...]], budget: int) -> list[dict]:
    """Per run with the bound tier's hits on its own order: the mean TTFT, the mean bound, the mean
    excess and its parts (mean s per call), and how concentrated the excess is."""
    rows = []
    for name, r in results.items():
        hits = own_hits.get(name)
        calls = [c for c in r.calls if c.ttft_s is not None and c.ttft_parts and c.access >= 0]
        if hits is None or not calls:
            continue
        gaps = [call_gap(costs, c, hits[c.access], budget) for c in calls]
        n = len(gaps)
        excess = sorted((g["excess_s"] for g in gaps), reverse=True)
        positive = sum(x for x in excess if x > 0)
        rows.append({"run": name, "ttft_mean_s": sum(c.ttft_s for c in calls) / n,
                     "bound_s": sum(g["bound_s"] for g in gaps) / n, "excess_s": sum(excess) / n,
                     **{k: sum(g[k] for g in gaps) / n for k in PARTS},
                     "top10_share": sum(x for x in excess[:max(1, n // 10)] if x > 0) / positive if positive else 0.0,
                     "over_1s": sum(x > 1.0 for x in excess)})
    return rows


def worst_calls(costs: CostModel, results: dict, own_hits: dict[str, tuple[int, ...]], budget: int,
                count: int) -> list[dict]:
    """Per run, its `count` calls with the largest excess over their own bound, worst first: who
    (session, call index, send time), the prompt and its uncached tokens at the first admission, and
    the excess in its parts (s; they sum to `excess_s`)."""
    rows = []
    for name, r in results.items():
        hits = own_hits.get(name)
        if hits is None or count <= 0:
            continue
        calls = [c for c in r.calls if c.ttft_s is not None and c.ttft_parts and c.access >= 0]
        gaps = sorted(((call_gap(costs, c, hits[c.access], budget), c) for c in calls),
                      key=lambda gc: -gc[0]["excess_s"])
        rows += [{"run": name, "session": c.session_id, "call": c.index, "sent_s": c.sent_s,
                  "prompt": c.prompt_tokens, "uncached": c.prompt_tokens - c.cached_tokens, "ttft_s": c.ttft_s,
                  **g} for g, c in gaps[:count]]
    return rows
