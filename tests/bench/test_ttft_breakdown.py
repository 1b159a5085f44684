"""The TTFT-parts table: the engine's parts, the server's and the driver's around them, and the
residual `other_s` that none of them sees."""

from __future__ import annotations

import pytest

from hintkv.bench.ttft_breakdown import AROUND, BREAKDOWN_COLUMNS, breakdown_rows
from hintkv.server.serve_times import SERVE_PARTS
from hintkv.workload.records import CallRecord

ENGINE = {"queue_s": 0.01, "load_s": 0.02, "blocked_s": 0.0, "shared_s": 0.03, "compute_s": 0.04}


def _rec(ttft: float, **around: float) -> CallRecord:
    return CallRecord("t", "s", 0, 0.0, ttft_s=ttft, ttft_parts={**ENGINE, **around})


def test_every_part_the_server_reports_has_a_column():
    assert set(SERVE_PARTS) < set(AROUND) and set(AROUND) < set(BREAKDOWN_COLUMNS)


def test_live_parts_are_averaged_and_other_is_what_none_of_them_sees():
    live = {"client_send_s": 0.001, "http_s": 0.004, "inbox_s": 0.02, "wake_s": 0.005, "stream_s": 0.002}
    recs = [_rec(0.2, **live), _rec(0.3, **{k: 2 * v for k, v in live.items()})]
    every = breakdown_rows("run", recs)[0]
    assert every["inbox_s"] == pytest.approx(0.03) and every["http_s"] == pytest.approx(0.006)
    seen = sum(ENGINE.values()) + 1.5 * sum(live.values())
    assert every["other_s"] == pytest.approx(0.25 - seen)


def test_a_run_without_live_parts_leaves_their_columns_empty():
    every, tail = breakdown_rows("sim", [_rec(0.1), _rec(0.1)])
    assert all(every[k] is None for k in AROUND)
    assert every["other_s"] == pytest.approx(0.1 - sum(ENGINE.values()))
