"""`bench swarm`'s interleaved rounds against a real server: every round replays a fresh copy of
the workload, so a server that stays up between rounds does not serve a later round from what an
earlier one cached; the live row is the median of the rounds."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from hintkv.bench.common import ServerProcess, hintkv_server
from hintkv.bench.swarm_rounds import median_row, rotated, round_table, run_rounds
from hintkv.workload.agent import HintPlan
from hintkv.workload.live import replay_live
from hintkv.workload.traces import Scale
from hintkv.workload.users import build_workload

TRACES = Path("/work/shared/traces")
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="shared/traces not present")


def test_rotated_order():
    assert [rotated(["a", "b", "c"], r) for r in range(4)] == [["a", "b", "c"], ["b", "c", "a"],
                                                               ["c", "a", "b"], ["a", "b", "c"]]


def test_rounds_on_a_server_that_stays_up_do_not_hit_each_other():
    wl = build_workload("swe-agent", TRACES / "swe-agent", 2, scale=Scale(1 / 32, max_calls=3), seed=3, stagger_s=1.0)
    args = argparse.Namespace(model="dummy:tiny", seed=0)
    extra = ["--kv-cache-tokens", str(4096 * 16), "--block-size", "16", "--eviction-policy", "sam"]
    with ServerProcess(hintkv_server("dummy:tiny", name="test-rounds", extra_args=extra)) as srv:
        rounds = run_rounds({"sam": (srv.base_url, True)}, wl, args, bpb=1, time_scale=50.0, rounds=2)
        # the control: round 1's own ids again, on the same warm server, do hit what it cached
        again = asyncio.run(replay_live(wl, srv.base_url, "dummy:tiny", HintPlan(hints=False), time_scale=50.0))
    first, second = rounds.rows["sam"]
    assert first["errors"] == second["errors"] == again.num_errors == 0
    assert first["calls"] == second["calls"] == wl.num_calls
    assert first["prompt_tokens"] == second["prompt_tokens"]
    assert abs(first["hit_rate"] - second["hit_rate"]) <= 0.03, (first["hit_rate"], second["hit_rate"])
    assert again.hit_rate > second["hit_rate"] + 0.1
    row = median_row(rounds.rows["sam"])
    assert row["rounds"] == 2 and row["calls"] == 2 * wl.num_calls
    assert row["per_round"]["hit_rate"] == [first["hit_rate"], second["hit_rate"]]
    assert [(r["round"], r["run"]) for r in round_table(rounds)] == [(1, "sam"), (2, "sam")]
