"""bench/engine: the KV format goals are computed from the measured rows, never typed in."""

from __future__ import annotations

import pytest

from hintkv.bench.engine_accuracy import KV_FORMATS, kv_quant_rows
from hintkv.bench.engine_measure import Workload
from hintkv.bench.engine_report import compute_goals, with_gemm_path


def test_kv_goals_follow_the_rows():
    rows = [{"kv": "int8", "capacity vs float32": 3.76, "capacity vs bfloat16": 1.88, "top-1 agreement": 0.99,
             "KL/token": 0.0007, "tokens": 295},
            {"kv": "fp8", "capacity vs float32": 1.5, "capacity vs bfloat16": 0.75, "top-1 agreement": 0.9,
             "KL/token": 0.0035, "tokens": 295}]
    g = compute_goals({}, Workload.for_run(True), None, None, rows, "float32")
    assert g["kv_int8_capacity_vs_float32"] == {"target": 2.0, "measured": 3.76, "met": True, "vs_bfloat16": 1.88}
    assert g["kv_int8_top1_agreement"]["met"] is True
    assert g["kv_fp8_capacity_vs_float32"]["met"] is False and g["kv_fp8_top1_agreement"]["met"] is False
    fp8 = g["kv_fp8_top1_agreement"]
    assert fp8["kl_per_token"] == 0.0035 and fp8["tokens"] == 295
    assert "0.00350/token is 5.0x int8's" in fp8["why"] and "one token of 295 is 0.0034" in fp8["why"]
    assert "same capacity" not in fp8["why"] and "at 1.50x float32's capacity vs int8's 3.76x" in fp8["why"]
    assert "int8 top-1 0.990" in fp8["why"]
    assert "why" not in g["kv_int8_top1_agreement"] and "ci95" not in g["kv_int8_top1_agreement"]
    rows[0]["top-1 95% CI"] = "0.9850-0.9930"  # the evaluation set's bootstrap interval travels with the goal
    assert compute_goals({}, Workload.for_run(True), None, None, rows, "float32")["kv_int8_top1_agreement"][
        "ci95"] == "0.9850-0.9930"
    acc = {"top1_agreement": 0.98, "top1_agreement_ci95": [0.975, 0.985], "decode_top1_agreement": 0.975,
           "decode_top1_agreement_ci95": [0.97, 0.98]}
    w8 = compute_goals({}, Workload.for_run(True), acc, None, None, "float32")["w8a8_top1_agreement"]
    assert w8["measured"] == 0.975 and w8["decode_top1_agreement_ci95"] == [0.97, 0.98]
    rows[1]["capacity vs float32"] = 3.76  # the real rows: both 68-byte rows
    same = compute_goals({}, Workload.for_run(True), None, None, rows, "float32")["kv_fp8_top1_agreement"]["why"]
    assert "at the same capacity (3.76x float32)" in same
    missing = compute_goals({}, Workload.for_run(True), None, None, None, "float32")
    assert all(missing[f"kv_{k}_top1_agreement"] == {"target": 0.97, "measured": None, "met": False,
                                                     "kl_per_token": None, "tokens": None}
               for k in KV_FORMATS)


def test_kv_rows_measure_capacity_from_the_block_sizes():
    rows = {r["kv"]: r for r in kv_quant_rows("bfloat16", texts="fixed")}
    # SmolLM2: head_dim 64 -> 68-byte rows against 128 bytes of bfloat16
    assert rows["int8"]["capacity vs bfloat16"] == 128 / 68 and rows["fp8"]["top-1 agreement"] > 0.9
    assert rows["fp8"]["KL/token"] > rows["int8"]["KL/token"] > 0  # fp8's 3 mantissa bits: the larger error


def test_the_w8a8_decode_goal_says_which_gemm_ran():
    """w8a8's decode ratio is ~1.5x on the VNNI loop and ~2.3x on AMX: the goal carries the path the
    run measured (`int8.gemv_path()`), and no path when w8a8 did not run."""
    from hintkv.models import int8

    goals = with_gemm_path(compute_goals({}, Workload.for_run(True)), int8.gemv_path())
    assert goals["w8a8_decode_vs_float32"]["gemm_path"] in ("amx", "vnni", "avx2", "avx2-i16", "int_mm")
    assert "gemm_path" not in with_gemm_path(compute_goals({}, Workload.for_run(True)), None)["w8a8_decode_vs_float32"]


def test_w8a8_decode_rows_step_within_the_int8_down_proj(monkeypatch):
    """The w8a8 `decode_*` accuracy rows step the text in as many tokens as down_proj's two-level int8
    kernel serves (`int8.fine_int8_rows`: 2 on AVX2 without VNNI), so they measure a one-token step's kernels."""
    from hintkv.bench.engine_accuracy import DECODE_STEP, decode_step
    from hintkv.models import int8

    monkeypatch.setattr(int8, "fine_int8_rows", lambda: 2)
    assert decode_step() == 2
    monkeypatch.setattr(int8, "fine_int8_rows", lambda: 16)
    assert decode_step() == DECODE_STEP


def test_the_comparison_goals_say_whether_every_sample_started_at_rest():
    from hintkv.bench.engine_measure import ServerFigures
    from hintkv.bench.engine_report import figures_json

    rested, busy = ServerFigures(rest_wait_max_s=0.5), ServerFigures(rest_wait_max_s=3.1, samples_not_at_rest=2)
    # at rest before each sample, but a peer computed during one (review_engine20 finding 6): not at rest
    # judged as a share of one CPU over the sample (review_eng21 finding 6): 0.1 CPU s over a 0.05 s cold TTFT is
    # 2 CPUs' worth (not at rest), 0.2 CPU s over a 4 s prefill is 0.05 of a CPU (at rest)
    shared, quiet = ServerFigures(rest_wait_max_s=0.5), ServerFigures(rest_wait_max_s=0.5)
    shared.record_others(0.02, 4.0)
    shared.record_others(0.1, 0.05)
    quiet.record_others(0.2, 4.0)
    quiet.record_others(0.001, 0.05)
    assert (shared.others_cpu_share_max, shared.others_cpu_max_s) == (2.0, 0.1)
    assert (quiet.others_cpu_share_max, quiet.others_cpu_max_s) == (0.05, 0.2)
    for peer, at_rest, during in ((rested, True, None), (busy, False, None), (shared, False, 2.0), (quiet, True, 0.05)):
        results = {"m": {"ratios": {}, "hintkv": ServerFigures(), "vllm": peer,
                         "variants": {"w8a8": {"figures": ServerFigures(), "ratios": {}}}}}
        goals = compute_goals(results, Workload.for_run(True))
        keys = ("prefill_512_2048_vs_vllm", "decode_b1_b8_vs_vllm", "cold_128_ttft_vs_vllm", "w8a8_decode_vs_float32")
        assert [goals[k]["rest"] for k in keys] == [at_rest] * 4
        assert [goals[k]["others_cpu_share_max"] for k in keys] == [during] * 4
        assert goals[keys[0]]["others_cpu_rest_share"] == 0.1
    assert figures_json(busy)["samples_not_at_rest"] == 2 and figures_json(busy)["rest_wait_max_s"] == 3.1


def test_each_figure_steps_through_the_williams_rows_round_by_round():
    """bench engine's sample order per figure (engine_measure.sample_orders): over as many rounds as Williams rows
    every figure runs each row once, so each server holds each place equally often and directly follows each other
    server equally often; no figure repeats an order before that. Rows taken in sample sequence gave --quick's b1
    vLLM right before hintkv in 3 of 3 rounds, and 5 servers X, reverse(X), X (review_eng21 finding 1)."""
    from collections import Counter

    from hintkv.bench.engine_measure import sample_orders, williams_rows

    for names in (["hintkv", "vllm"], ["hintkv", "w8a8", "vllm"], ["hintkv", "w8a8", "compiled", "vllm"],
                  ["hintkv", "w8a8", "compiled", "team", "vllm"]):
        cycle = len(williams_rows(len(names)))
        for figures in (5, 6):  # --quick's figures, a full run's
            orders = sample_orders(names, cycle, figures)
            for k in range(figures):
                rounds = [orders[r][k] for r in range(cycle)]
                assert len({tuple(o) for o in rounds}) == cycle  # every row once: no order repeats
                for name in names:
                    assert Counter(o.index(name) for o in rounds) == {p: cycle // len(names) for p in range(len(names))}
                before = Counter((a, b) for o in rounds for a, b in zip(o, o[1:]))
                assert len(set(before.values())) == 1 and len(before) == len(names) * (len(names) - 1)
    # --quick, 3 servers, 3 rounds: hintkv's predecessor within each figure is never the same server in all rounds
    quick = sample_orders(["hintkv", "w8a8", "vllm"], 3, 5)
    for k in range(5):
        before = [o[o.index("hintkv") - 1] if o.index("hintkv") else None for o in (quick[r][k] for r in range(3))]
        assert len(set(before)) > 1


def test_measure_interleaved_runs_each_figure_in_its_rounds_order(monkeypatch):
    """The sequence measure_interleaved actually runs (figure k of round r on each server, in order) is
    sample_orders' orders[r][k]: the samplers and the rest wait replaced by recorders, no server behind the urls."""
    import asyncio

    from hintkv.bench import engine_measure
    from hintkv.bench.engine_measure import Workload, measure_interleaved, sample_orders

    ran: list[tuple[int, str]] = []

    def recorder(k):
        async def sample(url, model, prompts, w):
            ran.append((k, url))
            return {f"fig{k}": 1.0}
        return sample

    async def no_warm_up(url, model, prompts, w):
        return None

    async def at_rest(pgids, min_s, max_s):
        return 0.0, True

    monkeypatch.setattr(engine_measure, "samplers", lambda w: [recorder(k) for k in range(5)])
    monkeypatch.setattr(engine_measure, "warm_up", no_warm_up)
    monkeypatch.setattr(engine_measure, "wait_idle", at_rest)
    names = ["hintkv", "w8a8", "vllm"]
    w = Workload.for_run(True)
    asyncio.run(measure_interleaved({n: n for n in names}, "dummy:tiny", None, w))
    want = [(k, name) for r in range(w.repeats) for k in range(5) for name in sample_orders(names, w.repeats, 5)[r][k]]
    assert ran == want and len(ran) == w.repeats * 5 * 3


def test_a_round_without_an_engine_ttft_keeps_the_others_paired_with_their_own_round():
    """A round whose last chunk carried no engine TTFT keeps its place (None), so the next rounds' client samples
    are not paired with an earlier round's engine sample (which gave 125 ms where every round gave 10)."""
    from hintkv.bench.stream_client import CompletionTiming
    from hintkv.bench.engine_measure import ServerFigures, _engine_ms

    with_it = CompletionTiming(prompt_tokens=128, sent_at=0.0, chunk_times=[0.06], num_tokens=1, total_s=0.06,
                               server_metrics={"ttft_s": 0.05})
    without = CompletionTiming(prompt_tokens=128, sent_at=0.0, chunk_times=[0.3], num_tokens=1, total_s=0.3)
    assert _engine_ms("cold", with_it) == {"engine_ms_cold": 50.0}
    assert _engine_ms("cold", without) == {"engine_ms_cold": None}
    f = ServerFigures(samples={"ttft_cold_ms": [60.0, 300.0, 70.0], "engine_ms_cold": [50.0, None, 60.0]})
    f.summarize()
    assert f.outside_ms() == {"cold": 10.0} and f.engine_ms == {"cold": 55.0}


def test_the_outside_of_a_ttft_is_the_client_less_the_engine_per_round():
    """hintkv's own engine TTFT rides along each TTFT sample; the rest (HTTP, handler, hand-offs, first chunk)
    is the median over rounds of client - engine, not the difference of the two medians."""
    from hintkv.bench.engine_measure import ServerFigures
    from hintkv.bench.engine_report import figures_json, outside_rows

    f = ServerFigures(samples={"prefill_ms_512": [180.0, 150.0, 200.0], "engine_ms_prefill_512": [140.0, 145.0, 150.0],
                               "ttft_cold_ms": [60.0, 55.0, 70.0], "ttft_cached_ms": [90.0, 85.0, 95.0],
                               "engine_ms_cold": [50.0, 49.0, 52.0]})
    f.summarize()
    assert f.engine_ms == {"prefill_512": 145.0, "cold": 50.0}
    assert f.outside_ms() == {"prefill_512": 40.0, "cold": 10.0}  # per round 40 / 5 / 50 and 10 / 6 / 18
    rows = {r["figure"]: r for r in outside_rows("m", "hintkv", f)}
    assert rows["prefill_512"]["client TTFT ms"] == 180.0 and rows["prefill_512"]["engine TTFT ms"] == 145.0
    assert rows["cold"]["outside ms"] == 10.0 and "cached" not in rows  # no engine figure: no row
    assert figures_json(f)["outside_ms"] == f.outside_ms()
    assert outside_rows("m", "vllm", ServerFigures()) == [] and outside_rows("m", "vllm", None) == []


def test_the_team_variants_differ_from_plain_hintkv_by_the_decode_team_switch_alone(monkeypatch):
    """What each server GETS (environ), with the caller's HINTKV_DECODE_TEAM=1 exported: in a run with a team
    variant plain hintkv and w8a8 run without the team (team against team would read ~1.0 by construction)."""
    import argparse

    from hintkv.bench.engine_servers import hintkv_spec, server_switches

    monkeypatch.setenv("HINTKV_DECODE_TEAM", "1")
    w = Workload.for_run(True)
    args = argparse.Namespace(dtype="float32", device="cpu", variants="w8a8,team,team-auto,regions")
    plain, team, auto, w8a8, regions = (hintkv_spec("dummy:tiny", args, w, v)
                                        for v in (None, "team", "team-auto", "w8a8", "regions"))
    assert "HINTKV_DECODE_TEAM" not in plain.environ() and "HINTKV_DECODE_TEAM" not in w8a8.environ()  # the default
    assert team.environ()["HINTKV_DECODE_TEAM"] == "1" and auto.environ()["HINTKV_DECODE_TEAM"] == "auto"
    assert regions.environ()["HINTKV_DECODE_TEAM"] == "0"
    alone = hintkv_spec("dummy:tiny", argparse.Namespace(dtype="float32", device="cpu", variants="w8a8"), w)
    assert alone.environ()["HINTKV_DECODE_TEAM"] == "1"  # no team variant: the caller's setting reaches them all
    assert team.env["HINTKV_DECODE_TEAM"] == "1" and auto.env["HINTKV_DECODE_TEAM"] == "auto"
    assert team.argv == auto.argv == plain.argv
    # what each server's figures record: the switches as it got them (None: unset, the default)
    assert server_switches(plain)["HINTKV_DECODE_TEAM"] is None
    assert server_switches(regions)["HINTKV_DECODE_TEAM"] == "0"
    assert server_switches(alone)["HINTKV_DECODE_TEAM"] == "1"  # the caller's export, recorded, not read as default
    assert set(server_switches(plain)) == {"HINTKV_CPU_KEEPER", "HINTKV_CPU_KEEPER_LINGER_MS", "HINTKV_DECODE_TEAM"}


def test_the_keeper_variant_differs_from_plain_hintkv_by_the_keeper_switch_alone(monkeypatch):
    """`--variants keeper` (engine/cpu_keeper.py): its server gets HINTKV_CPU_KEEPER=1, every other hintkv server
    runs without it even when the caller exported it, and a team variant in the same run keeps the team's switch."""
    import argparse

    from hintkv.bench.engine_servers import hintkv_spec

    monkeypatch.setenv("HINTKV_CPU_KEEPER", "1")
    w = Workload.for_run(True)
    args = argparse.Namespace(dtype="float32", device="cpu", variants="keeper,team")
    plain, keeper, team = (hintkv_spec("dummy:tiny", args, w, v) for v in (None, "keeper", "team"))
    assert keeper.environ()["HINTKV_CPU_KEEPER"] == "1" and "HINTKV_DECODE_TEAM" not in keeper.environ()
    assert "HINTKV_CPU_KEEPER" not in plain.environ() and "HINTKV_CPU_KEEPER" not in team.environ()
    assert team.environ()["HINTKV_DECODE_TEAM"] == "1"
    assert keeper.argv == plain.argv


def test_the_linger_variant_differs_from_plain_hintkv_by_the_keepers_linger_alone(monkeypatch):
    """`--variants linger`: its server's keepers linger 1 s (vLLM's poll after a request), every other hintkv server
    runs without the caller's exported linger, and the keepers' own switch stays the default for both."""
    import argparse

    from hintkv.bench.engine_servers import hintkv_spec

    monkeypatch.setenv("HINTKV_CPU_KEEPER_LINGER_MS", "7")
    monkeypatch.delenv("HINTKV_CPU_KEEPER", raising=False)
    w = Workload.for_run(True)
    args = argparse.Namespace(dtype="float32", device="cpu", variants="linger")
    plain, linger = (hintkv_spec("dummy:tiny", args, w, v) for v in (None, "linger"))
    assert linger.environ()["HINTKV_CPU_KEEPER_LINGER_MS"] == "1000"
    assert "HINTKV_CPU_KEEPER_LINGER_MS" not in plain.environ()
    assert "HINTKV_CPU_KEEPER" not in linger.environ() and linger.argv == plain.argv


@pytest.mark.parametrize("variant", ["team", "team-auto", "regions"])
@pytest.mark.parametrize("setting", [["--dtype", "bfloat16"], ["--device", "cuda"]])
def test_the_decode_threading_variants_are_refused_off_float32_cpu(variant, setting):
    """The team runs float32 and w8a8 decode steps on the CPU only: a team variant elsewhere would read ~1.0 by
    construction, so bench engine refuses it before starting anything (review_eng21 finding 5)."""
    from hintkv.bench.engine import main

    with pytest.raises(SystemExit, match="compare the CPU decode team"):
        main(["--quick", "--no-vllm", "--no-spec", "--variants", variant, *setting])


def test_a_server_without_engine_ttfts_keeps_no_null_engine_samples_in_the_json():
    """vLLM reports no engine TTFT: its engine_ms_* samples are all None and the figures JSON leaves them out;
    hintkv's, with a None for one round (a chunk without metrics), keep their place."""
    from hintkv.bench.engine_measure import ServerFigures
    from hintkv.bench.engine_report import figures_json

    peer = ServerFigures(samples={"prefill_ms_512": [180.0, 170.0], "engine_ms_prefill_512": [None, None]})
    ours = ServerFigures(samples={"prefill_ms_512": [150.0, 160.0], "engine_ms_prefill_512": [140.0, None]})
    assert figures_json(peer)["samples"] == {"prefill_ms_512": [180.0, 170.0]}
    assert figures_json(ours)["samples"]["engine_ms_prefill_512"] == [140.0, None]
    assert peer.samples["engine_ms_prefill_512"] == [None, None]  # the figures themselves keep them (reports)


@pytest.mark.parametrize("variant", ["keeper", "no-keeper", "linger", "w8a8-no-keeper"])
def test_the_keeper_variants_are_refused_off_the_cpu(variant):
    """On a GPU the keepers are never built: either row would be plain hintkv under the variant's name
    (review_keeper21 finding 10, review_lead22 finding 5)."""
    from hintkv.bench.engine import main

    with pytest.raises(SystemExit, match="--device cpu only"):
        main(["--quick", "--no-vllm", "--no-spec", "--variants", variant, "--device", "cuda"])
