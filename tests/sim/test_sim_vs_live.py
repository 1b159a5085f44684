"""The simulator, calibrated through the live server, agrees with that server on the same swarm.

One real `hintkv serve --model dummy:tiny` process: first `sim.calibrate_server` measures the
`local` profile through its HTTP API (prefill TTFT on a cached prefix, streamed decode gaps: the
path live requests take, under the same machine load), then the same small real-trace workload
(the agent programs of `hintkv.workload.agent`, hints on) is replayed against it over HTTP
(`hintkv.workload.live`) and simulated with the measured profile, same pool, same scheduler
limits. Token hit rate must agree within 2 points and mean TTFT within 15%. Range evicts are
skipped in both (the live driver cannot send them for token-id prompts).

It compares wall-clock timings, so it is a benchmark more than a test (STYLE: no timed
assertions in the suite): it runs only with HINTKV_SIM_VALIDATE=1, on a machine quiet enough
for timings to mean something (about 8 minutes on 2 cores).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from hintkv.bench.common import ServerProcess, hintkv_server
from hintkv.engine.model_runner import kv_bytes_per_block
from hintkv.models.presets import PRESETS
from hintkv.sim.calibrate_server import calibrate_server
from hintkv.sim.costs import CostModel
from hintkv.sim.simulate import CONFIGS, simulate
from hintkv.sim.workload import build_workload
from hintkv.workload.agent import HintPlan
from hintkv.workload.live import replay_live

CLAUDE = Path("/work/shared/traces/claude-code")
FILES = ["trace_0291", "trace_0277", "trace_0460", "trace_0615"]
GRID = {"new": (16, 128, 512), "cached": (0, 512), "batch": (1, 4), "context": (128, 1024), "repeats": 3}
KV_TOKENS = 16384
TIME_SCALE = 4.0
pytestmark = [
    pytest.mark.skipif(not CLAUDE.is_dir(), reason="the shared traces are not on this machine"),
    pytest.mark.skipif(os.environ.get("HINTKV_SIM_VALIDATE") != "1",
                       reason="a wall-clock validation: set HINTKV_SIM_VALIDATE=1 on a quiet machine"),
]


def test_sim_agrees_with_live_server(tmp_path):
    import torch

    for name in FILES:
        (tmp_path / f"{name}.json.gz").write_bytes((CLAUDE / f"{name}.json.gz").read_bytes())
    wl = build_workload([str(tmp_path)], users=2, seed=3, token_scale=0.02, max_calls=5, max_tasks=4,
                        stagger_s=2.0)
    spec = hintkv_server("dummy:tiny", extra_args=["--kv-cache-tokens", str(KV_TOKENS), "--dtype", "float32",
                                                   "--device", "cpu"])
    kv = kv_bytes_per_block(PRESETS["tiny"], 1, torch.float32)
    with ServerProcess(spec) as server:
        profile = calibrate_server(server.base_url, "dummy:tiny", kv, GRID)
        live = asyncio.run(replay_live(wl, server.base_url, "dummy:tiny", HintPlan(hints=True),
                                       time_scale=TIME_SCALE))
    assert live.num_errors == 0
    sim = simulate(wl, CONFIGS["sam+hints"], CostModel(profile), KV_TOKENS, max_num_seqs=64,
                   max_num_batched_tokens=2048, time_scale=TIME_SCALE)  # the live driver sends range evicts too
    live_ttft = sum(c.ttft_s for c in live.calls) / len(live.calls)
    print(f"hit rate live {live.hit_rate:.4f} sim {sim.hit_rate:.4f}; "
          f"mean TTFT live {live_ttft * 1e3:.1f} ms sim {sim.mean_ttft_s * 1e3:.1f} ms")
    assert len(sim.calls) == len(live.calls) == wl.num_calls
    assert abs(sim.hit_rate - live.hit_rate) <= 0.02
    assert abs(sim.mean_ttft_s - live_ttft) <= 0.15 * live_ttft
