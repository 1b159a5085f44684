"""`sim.contended`'s floors on a profile whose costs they cannot take (review rev26 B1): they hold only
if a step of more tokens costs no less (`cold` non-decreasing, and convex for the even split), and a
token's attention never costs more in a larger chunk. `hintkv sim calibrate` measures wall time, which
is not monotone under load ("a 16-token prefill measured 572 ms vs 262 ms for 128 tokens at load 6"):
there the "bound" was above a schedule the cost model itself allows, so `reachable` could call a goal
out of reach that a schedule meets. Now `CostModel.non_monotone` says why, the bound is None and the
chunk floors refuse (the first two tests are rev26's, with the bound read as "not known")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hintkv.sim.contended import chunk_floors_ms, contended_bound_s
from hintkv.sim.costs import CostModel
from hintkv.sim.goals import goals, ttft_bound
from hintkv.sim.profile import Profile, load_profile


def _profile(prefill_points, overhead_ms: float = 0.0) -> CostModel:
    profile = Profile(name="local-like", source="rev26", kv_bytes_per_token=1024, prefill_points=prefill_points,
                      decode_points=[(1, 256, 5.0), (1, 2048, 6.0), (8, 256, 9.0), (8, 2048, 12.0)])
    # a negative overhead is refused when a Profile is made (test_sim_costs); set after, the cost model's own
    # premise check still sees it
    profile.step_overhead_ms = overhead_ms
    return CostModel(profile)


def _one_call(prompt_tokens: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(access=0, sent_s=0.0, prompt_tokens=prompt_tokens, instance=0)]


def test_no_bound_on_a_profile_whose_cold_prefill_falls():
    costs = _profile([(16, 0, 572.0), (128, 0, 262.0), (512, 0, 600.0), (512, 512, 700.0)])
    # the 16-token call computed in one step beside 112 tokens of another call costs 262 ms in all,
    # under its "floor alone" of cold(16) = 572 ms
    assert costs.step_ms([(16, 0), (112, 0)]) < costs.cold_ms(16)
    assert "cold prefill falls from 16 to 128 tokens" in costs.non_monotone
    assert contended_bound_s(costs, _one_call(16), [0], 8192) is None
    with pytest.raises(ValueError, match="falls"):
        chunk_floors_ms(costs, 16, 0, 8192)


def test_no_bound_on_a_profile_whose_attention_rate_rises_with_the_chunk():
    # per new token, attention to a 2048-token prefix: 0.01 ms in a 128-token chunk, 0.05 ms in a 512-token one
    costs = _profile([(128, 0, 100.0), (512, 0, 400.0), (128, 2048, 100.0 + 128 * 0.01),
                      (512, 2048, 400.0 + 512 * 0.05)])
    assert costs.non_monotone == ("a token's attention to a 2048-token prefix costs more in a 512-token chunk "
                                  "than in a 128-token one")
    assert contended_bound_s(costs, _one_call(2048 + 512), [2048], 512) is None
    with pytest.raises(ValueError, match="attention"):
        chunk_floors_ms(costs, 2048 + 512, 2048, 512)


@pytest.mark.parametrize("points, overhead, why", [
    # slopes 1.0 then 0.5 ms a token: two 256-token chunks cost less than the even split's premise allows
    ([(128, 0, 10.0), (256, 0, 138.0), (512, 0, 266.0)], 0.0, "cold prefill is not convex from 256 to 512"),
    ([(128, 0, 10.0), (512, 0, 40.0)], -1.0, "step_overhead_ms -1.0 < 0"),
    # a prefix measured faster than the cold prefill: attention below zero
    ([(128, 0, 10.0), (512, 0, 40.0), (128, 1024, 9.0)], 0.0, "attention to a cached prefix is negative"),
    # cheaper in the larger chunk at 1024, equal at 2048, dearer past it (the rows' last slopes)
    ([(128, 0, 10.0), (512, 0, 40.0), (128, 1024, 10.0 + 128 * 0.02), (512, 1024, 40.0 + 512 * 0.01),
      (512, 2048, 40.0 + 512 * 0.03), (128, 2048, 10.0 + 128 * 0.03)], 0.0,
     "a prefix past 2048 tokens costs more in a 512-token chunk"),
])
def test_each_premise_is_checked(points, overhead, why):
    costs = _profile(points, overhead)
    assert why in costs.non_monotone
    assert contended_bound_s(costs, _one_call(600), [100], 512) is None


def test_a_monotone_profile_keeps_its_bound_and_it_is_under_a_feasible_schedule():
    # rev26's first profile with cold flat to 128 tokens: the premises hold
    costs = _profile([(16, 0, 262.0), (128, 0, 262.0), (512, 0, 600.0), (512, 512, 700.0)])
    assert costs.non_monotone is None
    bound_ms = contended_bound_s(costs, _one_call(16), [0], 8192) * 1e3
    assert 0 < bound_ms <= costs.step_ms([(16, 0), (112, 0)]) + 1e-9
    for name in ("h200-llama3-8b", "h200-llama3-70b"):
        assert CostModel(load_profile(name)).non_monotone is None, name


def test_the_goal_reads_not_known_without_the_bound():
    """No contended bound (the profile refused it): the TTFT goal's `bound` is None and `reachable`
    None ("not known"), not False."""
    lru_host = SimpleNamespace(mean_ttft_s=1.0, hit_rate=0.9, mean_task_s=10.0, wall_s=1.0, calls=[],
                               peak_host_bytes=10, peak_pool_bytes=0)
    hinted = SimpleNamespace(mean_ttft_s=0.6, hit_rate=0.9, mean_task_s=10.0, wall_s=1.0, calls=[],
                             peak_host_bytes=5, peak_pool_bytes=0)
    bounds = {"contended_run": "sam+hints+host", "contended_none_why": "cold prefill falls",
              "contended_s": None, "contended_compulsory_s": None, "alone_srpt_s": 0.5}
    assert ttft_bound(1.0, 0.3, bounds) is None
    g = goals({"lru+host": lru_host, "sam+hints+host": hinted}, {}, 10, None, bounds)["ttft_reduction_vs_lru_host"]
    assert g["met"] and g["reachable"] is None and g["bound"] is None
