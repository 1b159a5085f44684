"""Where the time to first token went, per run: the engine's `ttft_parts` averaged over calls.

    rows = breakdown_rows("lru", records)   # records: anything with ttft_s and ttft_parts
    print_table(rows, BREAKDOWN_COLUMNS)

Two rows per run: every call, and the tail (calls at or above the run's p90 TTFT), since the mean
TTFT of a swarm is mostly its tail. `other_s` is what the engine's clock does not see (the live
driver's HTTP and tokenizing; zero in the simulator).
"""

from __future__ import annotations

from hintkv.bench.common import percentile
from hintkv.engine.types import TtftParts

PARTS = TtftParts.FIELDS
BREAKDOWN_COLUMNS = ["run", "calls_of", "calls", "ttft_mean_s", *PARTS, "other_s"]


def _mean_row(run: str, which: str, recs: list) -> dict:
    n = len(recs)
    row = {"run": run, "calls_of": which, "calls": n,
           "ttft_mean_s": sum(r.ttft_s for r in recs) / n if n else None}
    for k in PARTS:
        row[k] = sum(r.ttft_parts[k] for r in recs) / n if n else None
    row["other_s"] = (row["ttft_mean_s"] - sum(row[k] for k in PARTS)) if n else None
    return row


def breakdown_rows(run: str, records) -> list[dict]:
    recs = [r for r in records if r.ttft_s is not None and r.ttft_parts]
    if not recs:
        return []
    p90 = percentile([r.ttft_s for r in recs], 90)
    return [_mean_row(run, "all", recs), _mean_row(run, "p90+", [r for r in recs if r.ttft_s >= p90])]
