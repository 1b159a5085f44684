"""The swarm replay's pace (`bench/swarm_pace.py`): the deployment's tool : serving ratio, kept on
any engine; the server's speed measured through its HTTP API."""

from __future__ import annotations

import asyncio

import pytest

from hintkv.bench.common import ServerProcess, hintkv_server
from hintkv.bench.swarm_live import live_time_scale
from hintkv.bench.swarm_pace import (
    Speed,
    call_tokens,
    deployment_serving_s,
    fit_speed,
    measure_speed,
    pace,
    reference_speed,
    serving_s,
)
from hintkv.replay import OfflineConfig
from hintkv.workload.program import AgentScript, Call, Task, User, Workload


def _workload(token_scale: float = 1 / 16) -> Workload:
    a = tuple(range(100))
    calls = (Call((a[:40],), 5, wait_s=3.0), Call((a[:70],), 4, wait_s=1.0), Call((a[:20],), 6))  # 3rd: compressed
    return Workload("hand", (User("u0", 0.0, (Task("t", "hand", AgentScript("t", calls)),)),),
                    {"token_scale": token_scale})


def test_call_tokens_are_what_each_prompt_adds():
    assert list(call_tokens(_workload())) == [(40, 0, 5), (30, 40, 4), (20, 0, 6)]


def test_fit_speed_is_the_line_through_two_prompts():
    s = fit_speed([(256, 30.0), (32, 8.0)], 20.0)
    assert s.prefill_s_per_token == pytest.approx(22.0 / 224 / 1e3)
    assert s.call_s == pytest.approx(8.0 / 1e3 - 32 * s.prefill_s_per_token)
    assert s.decode_s_per_token == pytest.approx(0.02)
    assert s.serve_s(10, 2) == pytest.approx(s.call_s + 10 * s.prefill_s_per_token + 0.04)


def test_pace_keeps_the_deployment_ratio_on_any_engine():
    wl = _workload()
    fast = Speed(0.01, 1e-4, 0.01)
    slow = Speed(0.03, 3e-4, 0.03)  # three times slower in every part
    assert pace(wl, fast) == pytest.approx(3 * pace(wl, slow))
    for s in (fast, slow):  # replay serving time x pace = the deployment's serving time
        assert serving_s(wl, s) * pace(wl, s) == pytest.approx(deployment_serving_s(wl))
    # the deployment serves the full-scale calls: a smaller token scale means longer calls there
    assert deployment_serving_s(_workload(1 / 32)) > deployment_serving_s(wl) > 0


def test_live_time_scale_keeps_the_offline_ratio():
    wl = _workload()
    model = reference_speed(OfflineConfig())
    measured = Speed(0.05, 8e-4, 0.04)
    scale, slowdown = live_time_scale(wl, 7.5, model, measured)
    assert slowdown == pytest.approx(serving_s(wl, measured) / serving_s(wl, model))
    assert serving_s(wl, measured) * scale == pytest.approx(serving_s(wl, model) * 7.5)


def test_measure_speed_through_a_real_server():
    with ServerProcess(hintkv_server("dummy:tiny", name="test-pace", extra_args=["--kv-cache-tokens", "2048"])) as srv:
        s = asyncio.run(measure_speed(srv.base_url, "dummy:tiny"))
    assert s.call_s >= 0 and s.prefill_s_per_token >= 0 and s.decode_s_per_token > 0
    assert s.serve_s(256, 8) > s.serve_s(32, 1)
