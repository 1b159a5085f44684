"""`hintkv sim --hinted-offload-mode`: the simulated engine's tiers do what `hintkv serve
--offload-mode` does with an offload hint (the real `TierConnector`): lazy writes a waiting session's
blocks down at the hint, deferred writes nothing then (what the device evicts later goes down). Before
this the simulator built its tiers in lazy mode whatever the engine config said."""

from __future__ import annotations

import pytest

from hintkv.config import EngineConfig
from hintkv.sim.clock import EventClock
from hintkv.sim.engine import SimEngine
from hintkv.sim.simulate import CONFIGS, simulate
from hintkv.sim.workload import build_workload


@pytest.mark.parametrize("mode", ["lazy", "eager", "deferred"])
def test_the_engine_config_reaches_the_tiers(costs, mode):
    cfg = EngineConfig(model="sim", block_size=16, kv_cache_tokens=256 * 16, eviction_policy="sam",
                       hints=True, offload_mode=mode)
    eng = SimEngine(cfg, costs, EventClock(), 256, host_blocks=1024)
    assert eng.scheduler.kv.tiers.offload_mode == mode


def test_deferred_writes_less_down_than_lazy_on_real_traces(traces, costs):
    wl = build_workload([traces], users=3, seed=1, token_scale=0.05, max_calls=6, max_tasks=6, stagger_s=5.0)
    device = 6000  # as test_sim_bound: the prompts fit, and the host tier sees traffic
    out = {m: simulate(wl, CONFIGS["sam+hints+host"], costs, device_tokens=device, offload_mode=m)
           for m in ("lazy", "deferred")}
    assert len(out["lazy"].calls) == len(out["deferred"].calls)
    down = {m: sum(v for k, v in r.bytes_moved.items() if k.startswith("device")) for m, r in out.items()}
    assert down["lazy"] > 0
    assert down["deferred"] < down["lazy"], down
    assert out["deferred"].peak_host_bytes < out["lazy"].peak_host_bytes
