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
