"""`hintkv bench swarm_sched`: the swarm's live runs on the simulator's engine; the report's goals
are computed from its rows (a reduction of each cell's sam+host against its lru / lru+host)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hintkv.bench import swarm_sched

pytestmark = pytest.mark.skipif(not Path("/work/shared/traces").exists(), reason="shared/traces not present")


def test_quick_rows_and_goals_are_consistent(capsys):
    assert swarm_sched.main(["--quick", "--profile", "h200-llama3-8b", "--max-calls", "3", "--users", "4"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {r["run"]: r for r in report["rows"]}
    floor = rows.pop("unloaded")["task_mean_s"]
    assert report["admission"] == "prefill-judged"  # the hinted runs' default scheduler
    assert set(rows) == {name for name, *_ in swarm_sched.runs("prefill-judged")}
    assert 0 < floor <= min(r["task_mean_s"] for r in rows.values())  # no run beats the unloaded floor
    t = report["goals"]["task_e2e_reduction_vs_lru"]
    assert t["ceiling_per_cell"] == [pytest.approx(1 - floor / rows["lru"]["task_mean_s"])]
    assert rows["sam+host"]["admission"] == "prefill-judged" and rows["lru+host"]["admission"] == "fcfs"
    for r in rows.values():
        assert 0.0 <= r["hit_rate"] <= 1.0 and r["ttft_mean_s"] > 0
        assert sum(r[k] for k in swarm_sched.PARTS) == pytest.approx(r["ttft_mean_s"], rel=1e-6)
    g = report["goals"]["ttft_reduction_vs_lru_host"]
    assert g["measured"] == pytest.approx(1 - rows["sam+host"]["ttft_mean_s"] / rows["lru+host"]["ttft_mean_s"])
    assert g["met"] == (g["measured"] >= 0.2)


def test_goals_over_a_cell_without_a_baseline_are_unmet_not_a_crash():
    """Review rev27 A3: a cell whose lru run got no first token (mean 0) or lacks a run reads as unmeasured."""
    rows = []
    for seed in (0, 1):
        for run, t in (("sam+host", 1.0), ("lru+host", 2.0), ("lru", 2.0)):
            rows.append({"kind": "swe", "seed": seed, "run": run, "ttft_mean_s": t, "task_mean_s": t})
        rows.append({"kind": "swe", "seed": seed, "run": "unloaded", "task_mean_s": 0.5})
    rows[2]["ttft_mean_s"] = 0.0  # seed 0's lru: no call got a first token
    g = swarm_sched.goals(rows)
    assert g["ttft_reduction_vs_lru"]["measured"] is None and g["ttft_reduction_vs_lru"]["met"] is False
    assert g["ttft_reduction_vs_lru"]["per_cell"] == [None, 0.5] and "1 of 2 cells" in g["ttft_reduction_vs_lru"]["why"]
    assert g["ttft_reduction_vs_lru_host"]["measured"] == 0.5 and "why" not in g["ttft_reduction_vs_lru_host"]
    del rows[-1]  # seed 1 without its unloaded run
    assert swarm_sched.goals(rows)["task_e2e_reduction_vs_lru"]["ceiling_per_cell"] == [0.75, None]
