"""bench/engine_cputime and the fairness of bench engine's servers: real engines, no vLLM needed."""

from __future__ import annotations

import argparse
import json
import os

import torch

from hintkv.bench.engine_cputime import REGIONS, Probe, main
from hintkv.bench.engine_measure import Workload
from hintkv.bench.engine_servers import hintkv_spec, server_threads


def test_every_hintkv_server_gets_as_many_threads_as_vllm_binds():
    args = argparse.Namespace(dtype="float32", device="cpu")
    w = Workload.for_run(True)
    for variant in (None, "w8a8"):
        spec = hintkv_spec("dummy:tiny", args, w, variant)
        assert spec.env["OMP_NUM_THREADS"] == str(server_threads()) == str(os.cpu_count() or 1)


def test_regions_are_parts_of_the_step_and_the_step_still_generates():
    p = Probe()
    r = p.run(48, 3)
    assert r["step"] > 0 and all(r.get(x, 0.0) >= 0 for x in REGIONS)
    assert r["gemm"] > 0 and r["lm_head"] > 0 and "attention" not in r and "sample" not in r  # module timers off
    assert sum(r.get(x, 0.0) for x in REGIONS) <= r["step"]
    with p.module_timers():
        steps = p.decode(2, 3)
    # greedy rows: the sampler runs only where the LM head's screen does not (greedy_head.py), and that
    # screen's time is the LM head's
    model = p.engine.runner.model
    screened = model.greedy_tokens(torch.zeros(1, model.config.hidden_size)) is not None
    assert len(steps) == 3 and all(s.get("attention", 0.0) > 0 and s.get("lm_head", 0.0) > 0 for s in steps)
    assert all((s.get("sample", 0.0) > 0) != screened for s in steps)
    assert all(sum(s.get(x, 0.0) for x in REGIONS) <= s["step"] for s in steps)
    assert not p.engine.has_work()


def test_json_goals_are_computed_from_the_runs(capsys):
    assert main(["--quick", "--no-vllm", "--lengths", "32", "--batches", "1"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    goals = last["goals"]
    assert goals["prefill_cpu_vs_vllm"] == {"target": 1.2, "measured": None, "met": False}  # no vLLM: unmeasured
    w8 = goals["w8a8_decode_b1_cpu_vs_float32"]
    d = last["hintkv"]["decode_step_ms"]
    assert w8["measured"] == d["1"] / d["1 w8a8"] and w8["met"] == (w8["measured"] >= 1.5)
