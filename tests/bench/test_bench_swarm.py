"""`hintkv bench swarm`'s report is consistent: hits <= queries, ratios and goals computed from the runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hintkv.bench.swarm_goals import GOALS, compute_goals
from hintkv.bench.swarm_study import captured, run_configs, size_workload
from hintkv.replay import OfflineConfig
from hintkv.workload.traces import Scale
from hintkv.workload.users import build_workload

TRACES = Path("/work/shared/traces")
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="shared/traces not present")


def test_report_fields_are_consistent():
    wl = build_workload("swe-agent", TRACES / "swe-agent", 3, scale=Scale(1 / 32, max_calls=6), seed=2)
    base = OfflineConfig()
    memo: dict = {}
    sizing = size_workload(wl, base, memo)
    device = sizing.device_blocks(0.35)
    runs = run_configs(wl, base, device, 4 * device, memo)
    for name, row in runs.items():
        if name.startswith("_") or "prompt_tokens" not in row:
            continue
        assert 0 <= row["hit_tokens"] <= row["prompt_tokens"]
        assert row["recomputed_tokens"] == row["prompt_tokens"] - row["hit_tokens"]
        assert row["hit_rate"] == pytest.approx(row["hit_tokens"] / row["prompt_tokens"])
        assert 0 <= row["host_hit_rate"] <= row["hit_rate"]
        assert row["mean_host_blocks"] <= row["peak_host_blocks"] <= 4 * device
        assert runs["oracle+host"]["hit_rate"] >= row["hit_rate"] - 1e-9
    assert runs["oracle"]["hit_rate"] <= runs["oracle+host"]["hit_rate"] <= sizing.ideal_hit_rate + 1e-9
    grid = [{"users": 3, "fraction": 0.35, "tier": "device", "lru": runs["lru"]["hit_rate"],
             "sam": runs["sam"]["hit_rate"], "oracle": runs["oracle"]["hit_rate"],
             "captured": captured(runs["sam"]["hit_rate"], runs["lru"]["hit_rate"], runs["oracle"]["hit_rate"])}]
    goals = compute_goals({}, runs, {0.35: runs}, grid)
    assert set(goals) == {"hit_rate_ratio", "captured_headroom", "hints_beyond_queue", "peak_host_reduction",
                          "ttft_reduction_vs_lru", "ttft_reduction_vs_lru_host", "task_e2e_reduction_vs_lru"}
    ratio = runs["sam+host"]["hit_rate"] / runs["lru"]["hit_rate"]
    assert goals["hit_rate_ratio"]["measured"] == pytest.approx(ratio)
    assert goals["hit_rate_ratio"]["met"] == (ratio >= GOALS["hit_rate_ratio"])
    diff = runs["sam+host"]["hit_rate"] - runs["qlru+host"]["hit_rate"]
    assert goals["hints_beyond_queue"]["measured"] == pytest.approx(diff)
    assert goals["ttft_reduction_vs_lru"] == {"target": 0.5, "measured": None, "met": False, "unit": "wall s",
                                              "wall_measured": None}  # no live runs
    for g in goals.values():
        assert set(g) >= {"target", "measured", "met"}


def test_timed_goals_use_model_seconds_when_each_run_measured_its_server():
    """Two live runs on a machine whose speed changed between them: in wall seconds sam+host looks
    no faster; divided by each server's measured slowdown, it is."""
    live = {"lru": {"ttft_mean_s": 1.0, "e2e_task_mean_s": 10.0, "ttft_mean_model_s": 1.0 / 2.0,
                    "e2e_task_mean_model_s": 10.0 / 2.0},
            "sam+host": {"ttft_mean_s": 1.0, "e2e_task_mean_s": 9.0, "ttft_mean_model_s": 1.0 / 4.0,
                         "e2e_task_mean_model_s": 9.0 / 4.0}}
    goals = compute_goals(live, {}, {}, [])
    g = goals["ttft_reduction_vs_lru"]
    assert g["unit"] == "model s" and g["measured"] == pytest.approx(0.5) and g["met"]
    assert g["wall_measured"] == pytest.approx(0.0)
    t = goals["task_e2e_reduction_vs_lru"]
    assert t["measured"] == pytest.approx(1 - 2.25 / 5.0) and t["wall_measured"] == pytest.approx(0.1)
    del live["sam+host"]["ttft_mean_model_s"]  # a run that did not measure: wall seconds
    assert compute_goals(live, {}, {}, [])["ttft_reduction_vs_lru"]["unit"] == "wall s"


def test_admission_column_names_what_the_server_runs():
    from hintkv.bench.swarm_live import LIVE_ADMISSION, admission_of

    assert admission_of("sam+host", []) == LIVE_ADMISSION["sam+host"] == "prefill-first"
    assert admission_of("lru", []) == "fcfs"
    assert admission_of("sam+host", ["--scheduling-policy", "short-first"]) == "short-first"
    assert admission_of("lru", ["--scheduling-policy=cache-aware"]) == "cache-aware"
