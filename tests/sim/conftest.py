"""Shared fixtures of the simulator tests: a small slice of the real traces, the cost model."""

from __future__ import annotations

from pathlib import Path

import pytest

from hintkv.sim.costs import CostModel
from hintkv.sim.profile import load_profile
from hintkv.sim.workload import DEFAULT_TRACES

CLAUDE = Path(DEFAULT_TRACES[0])
# small real sessions, two of them with sub-agents
FILES = ["trace_0291", "trace_0277", "trace_0460", "trace_0615", "trace_0638"]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> str:
    """A folder with the FILES of the claude-code traces (skips where they are not here)."""
    if not CLAUDE.is_dir():
        pytest.skip("the shared traces are not on this machine")
    d = tmp_path_factory.mktemp("traces")
    for name in FILES:
        (d / f"{name}.json.gz").write_bytes((CLAUDE / f"{name}.json.gz").read_bytes())
    return str(d)


@pytest.fixture(scope="module")
def costs() -> CostModel:
    return CostModel(load_profile("h200-llama3-8b"))
