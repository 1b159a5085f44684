"""Where the time to first token went, per run: each call's TTFT parts averaged over calls.

    rows = breakdown_rows("lru", records)   # records: anything with ttft_s and ttft_parts
    print_table(rows, BREAKDOWN_COLUMNS)

Two rows per run: every call, and the tail (calls at or above the run's p90 TTFT), since the mean
TTFT of a swarm is mostly its tail. The engine's parts (`TtftParts`, on its clock from the
request's arrival at the scheduler) come from both the simulator and a live server; a live
hintkv server also reports its own parts around the engine (`server/serve_times.py`: the handler
before the engine, the engine thread's inbox, the hand-back to the event loop, the first chunk),
and the live driver its own (`client_send_s`: the agent ready -> the request sent). `other_s` is
what none of them sees: uvicorn's HTTP parsing before the handler, the sockets, and the client
reading the first chunk (zero in the simulator). A part no record of a run carries is left empty.
"""

from __future__ import annotations

from hintkv.bench.common import percentile
from hintkv.engine.types import TtftParts
from hintkv.server.serve_times import SERVE_PARTS

PARTS = TtftParts.FIELDS
# the live parts outside the engine: the driver's, then the server's (server/serve_times.SERVE_PARTS)
AROUND = ("client_send_s", *SERVE_PARTS)
BREAKDOWN_COLUMNS = ["run", "calls_of", "calls", "ttft_mean_s", *PARTS, *AROUND, "other_s"]


def _mean_row(run: str, which: str, recs: list) -> dict:
    n = len(recs)
    row = {"run": run, "calls_of": which, "calls": n,
           "ttft_mean_s": sum(r.ttft_s for r in recs) / n if n else None}
    for k in PARTS:
        row[k] = sum(r.ttft_parts[k] for r in recs) / n if n else None
    for k in AROUND:
        row[k] = (sum(r.ttft_parts.get(k, 0.0) for r in recs) / n
                  if any(k in r.ttft_parts for r in recs) else None)
    row["other_s"] = (row["ttft_mean_s"] - sum(row[k] or 0.0 for k in (*PARTS, *AROUND))) if n else None
    return row


def breakdown_rows(run: str, records) -> list[dict]:
    recs = [r for r in records if r.ttft_s is not None and r.ttft_parts]
    if not recs:
        return []
    p90 = percentile([r.ttft_s for r in recs], 90)
    return [_mean_row(run, "all", recs), _mean_row(run, "p90+", [r for r in recs if r.ttft_s >= p90])]
