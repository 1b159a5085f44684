"""`hintkv bench fuzz` on a few cases, in-process (the real app and engine through
httpx.ASGITransport): every case answered, none a 5xx, the server still serves, no KV block
left in use and no integrity violation."""

from __future__ import annotations

from hintkv.bench.fuzz import run


def test_bench_fuzz_in_process_counts_every_case():
    row = run(60, seed=2, transport="asgi", cases_seed=2)
    assert row["cases_seed"] == 2  # a run's cases are drawn again from the seed it reports
    assert row["cases"] == 60
    assert row["2xx"] + row["4xx"] == 60 and row["5xx"] == 0
    assert row["crashes"] == 0 and row["contract_breaks"] == 0
    assert row["internal_errors"] == 0 and row["integrity_violations"] == 0
    assert row["served_after"] and row["blocks_left"] == 0
