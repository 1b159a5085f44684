"""The shared benchmark helpers: statistics, goal objects, the table and JSON-line output,
prompt factories, the batch-throughput window, and a real subprocess server's lifecycle."""

from __future__ import annotations

import json
import sys

import pytest

from hintkv.bench.common import (
    PromptFactory,
    ServerProcess,
    ServerSpec,
    emit_json,
    format_table,
    goal,
    goal_at_least,
    goal_at_most,
    median,
    percentile,
    ratio,
    summarize,
)
from hintkv.bench.stream_client import CompletionTiming, batch_decode_tok_per_s


def test_percentile_interpolates_like_numpy_linear():
    xs = [10.0, 1.0, 4.0, 7.0]  # sorted: 1 4 7 10
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 10.0
    assert percentile(xs, 50) == pytest.approx(5.5)
    assert percentile(xs, 90) == pytest.approx(9.1)
    assert median([3.0]) == 3.0
    assert median([5, 1, 3]) == 3.0


def test_percentile_rejects_empty_and_out_of_range():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_fields():
    s = summarize(range(1, 101))
    assert s["n"] == 100
    assert s["mean"] == pytest.approx(50.5)
    assert s["p50"] == pytest.approx(50.5)
    assert s["p99"] == pytest.approx(99.01)
    assert s["max"] == 100


def test_ratio_handles_missing_values():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None


def test_goal_objects_are_computed_from_measurements():
    assert goal(1.0, 0.5, False) == {"target": 1.0, "measured": 0.5, "met": False}
    assert goal_at_least(1.0, 1.2)["met"] is True
    assert goal_at_least(1.0, 0.99)["met"] is False
    assert goal_at_most(1.5, 1.5)["met"] is True
    assert goal_at_most(1.5, 1.51)["met"] is False
    # a measurement that did not happen never meets a goal
    assert goal_at_least(1.0, None) == {"target": 1.0, "measured": None, "met": False}
    assert goal_at_most(1.5, None)["met"] is False


def test_a_goals_verdict_follows_its_direction():
    """`reachable`: the target within the ceiling, each way; an unknown ceiling gives None, no
    ceiling no verdict; a goal met is never unreachable."""
    assert goal_at_least(0.3, 0.2, reach=0.35)["reachable"] is True
    assert goal_at_least(0.3, 0.2, reach=0.25)["reachable"] is False
    assert goal_at_most(300.0, 350.0, reach=250.0)["reachable"] is True
    assert goal_at_most(300.0, 350.0, reach=320.0)["reachable"] is False
    assert goal_at_least(0.3, 0.2, reach=None)["reachable"] is None
    assert "reachable" not in goal_at_least(0.3, 0.2) and "reachable" not in goal_at_most(1.0, 2.0)
    for at, target, measured, reach in ((goal_at_least, 0.3, 0.31, 0.31), (goal_at_most, 300.0, 299.0, 299.0)):
        g = at(target, measured, reach=reach)
        assert g["met"] and g["reachable"]


def test_format_table_aligns_columns_and_marks_missing():
    rows = [{"model": "tiny", "tok_s": 1234.5, "ratio": 0.5}, {"model": "smollm2-135m", "tok_s": 12.345}]
    text = format_table(rows, ["model", "tok_s", "ratio"])
    lines = text.splitlines()
    assert lines[0].split() == ["model", "tok_s", "ratio"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["tiny", "1,234", "0.5"]
    assert lines[3].split() == ["smollm2-135m", "12.35", "-"]
    assert len({len(line) for line in lines}) == 1  # every line the same width


def test_emit_json_is_one_compact_line(capsys):
    emit_json({"bench": "x", "goals": {"g": goal_at_least(1.0, 2.0)}, "v": float("nan")})
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    obj = json.loads(out)
    assert obj["goals"]["g"]["met"] is True
    assert " " not in out.strip().replace('"bench"', "")


def _strict_json(text: str):
    """json.loads refusing NaN / Infinity / -Infinity, which Python's json writes and reads but JSON has not."""
    def refuse(token):
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_emit_json_writes_every_non_finite_float_as_null(capsys):
    """Review rev27 A1: nested, in goals, lists, tuples, dataclasses and numpy / torch scalars alike."""
    import dataclasses

    import numpy as np
    import torch

    @dataclasses.dataclass
    class Row:
        ratio: float
        spread: tuple

    emit_json({"bench": "x", "v": float("nan"), "g": goal_at_least(0.3, float("inf")),
               "rows": [Row(float("-inf"), (1.5, float("nan")))], "np": np.float32("nan"),
               "t": torch.tensor(float("inf")), "ok": [0.25, np.float64(2.0)]})
    obj = _strict_json(capsys.readouterr().out)
    assert obj["v"] is None and obj["g"]["measured"] is None
    assert obj["rows"] == [{"ratio": None, "spread": [1.5, None]}]
    assert obj["np"] is None and obj["t"] is None and obj["ok"] == [0.25, 2.0]


def test_prompt_factory_prompts_never_share_a_first_token():
    pf = PromptFactory(vocab_size=200, seed=1)
    prompts = [pf.make(8) for _ in range(100)]
    assert all(len(p) == 8 for p in prompts)
    assert len({p[0] for p in prompts}) == 100
    assert all(16 <= t < 200 for p in prompts for t in p)


def _timing(sent_at: float, chunks: list[float]) -> CompletionTiming:
    return CompletionTiming(prompt_tokens=4, sent_at=sent_at, chunk_times=chunks, num_tokens=len(chunks),
                            total_s=chunks[-1])


def test_completion_timing_ttft_and_decode_rate():
    t = _timing(0.0, [0.5, 0.6, 0.7, 0.9])
    assert t.ttft_s == 0.5
    assert t.inter_token_s == pytest.approx([0.1, 0.1, 0.2])
    assert t.decode_tok_per_s == pytest.approx(3 / 0.4)


def test_a_stream_read_in_one_bunch_is_no_decode_rate():
    """Chunks that came in one read (the client held up while they queued) span microseconds: not
    a rate (one bench round read 293,261 tok/s so); a few bunched chunks among paced ones are."""
    bunched = _timing(0.0, [0.9 + i * 1e-5 for i in range(32)])
    assert bunched.decode_tok_per_s is None
    paced = _timing(0.0, [0.5 + 0.01 * i for i in range(30)] + [0.79 + 1e-5, 0.79 + 2e-5])
    assert paced.decode_tok_per_s == pytest.approx(31 / (paced.chunk_times[-1] - 0.5))


def test_batch_decode_window_counts_only_where_all_streams_decode():
    # two streams in lockstep, 10 tokens each, one every 0.1 s after a 1 s prefill
    chunks = [1.0 + 0.1 * i for i in range(10)]
    both = [_timing(0.0, chunks), _timing(0.0, chunks)]
    assert batch_decode_tok_per_s(both) == pytest.approx(2 / 0.1)


def test_batch_decode_ignores_a_window_of_a_sliver():
    """One stream ending just as the last one starts leaves a window of microseconds holding a step's
    bunched chunks (`bench engine` once printed 44,866 tok/s at batch 8): the plain total counts instead."""
    first = _timing(0.0, [0.1 * i + 0.1 for i in range(10)])  # 0.1 .. 1.0
    second = _timing(0.0, [0.9999, 1.0, 1.0, 1.0, 1.0, 1.5, 2.0])
    assert batch_decode_tok_per_s([first, second]) == pytest.approx(15 / 1.9)


def test_batch_decode_falls_back_when_streams_ran_one_after_another():
    first = _timing(0.0, [0.1 * i + 0.1 for i in range(10)])  # 0.1 .. 1.0
    second = _timing(0.0, [1.1 + 0.1 * i for i in range(10)])  # 1.1 .. 2.0
    # no overlap: 18 decoded tokens over 1.9 s, not a doubled rate
    assert batch_decode_tok_per_s([first, second]) == pytest.approx(18 / 1.9)


_HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_server_process_waits_for_health_and_stops():
    import httpx

    spec = ServerSpec(name="stub", argv=[sys.executable, "-c", _HEALTH_SERVER, "{port}"], startup_timeout_s=30)
    srv = ServerProcess(spec)
    with srv:
        assert httpx.get(srv.base_url + "/health").status_code == 200
        proc = srv.proc
    assert proc is not None and proc.poll() is not None


def test_server_process_reports_an_early_exit():
    spec = ServerSpec(name="dies", argv=[sys.executable, "-c", "print('boom'); raise SystemExit(3)"],
                      startup_timeout_s=30)
    with pytest.raises(RuntimeError, match="boom"):
        ServerProcess(spec).start()


def test_free_port_keeps_to_the_range_it_is_given(monkeypatch):
    """HINTKV_BENCH_PORTS=LO-HI (a shared machine's share of ports): every server port comes
    from the range, a taken port is skipped, and ports handed out one after another differ
    before any server listens on them."""
    import socket

    from hintkv.bench import common

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        lo = taken.getsockname()[1]
        monkeypatch.setenv(common.PORTS_ENV, f"{lo}-{lo + 3}")
        monkeypatch.setattr(common, "_next_port", [])
        ports = [common.free_port() for _ in range(3)]
    assert lo not in ports and len(set(ports)) == 3
    assert all(lo < p <= lo + 3 for p in ports)
    assert common.free_port() in range(lo, lo + 4)  # wraps around the range once it is through


# ---------------------------------------------------------------- goals over runs with errored calls
# (review rev26 A4: hit rate and TTFT read the calls that answered; a run whose slow calls failed read "met")


def _calls(slow_fail: bool) -> list:
    """Ten calls of 1000 prompt tokens: five fast with hits, five slow cold ones (errored if `slow_fail`)."""
    from hintkv.workload.records import CallRecord

    out = []
    for i in range(10):
        fast = i < 5
        c = CallRecord("t", f"s{i}", 0, 0.0, ttft_s=0.1 if fast else 2.0, e2e_s=3.0, prompt_tokens=1000,
                       cached_tokens=800 if fast else 0, completion_tokens=10)
        if not fast and slow_fail:
            c.ttft_s, c.e2e_s, c.prompt_tokens, c.cached_tokens, c.error = None, None, None, None, "ReadTimeout"
        out.append(c)
    return out


def test_a_hinted_run_whose_slow_calls_failed_meets_no_sessions_goal():
    from hintkv.bench.sessions import compute_goals, run_row
    from hintkv.workload.replay import ReplayResult
    from hintkv.workload.working_set import WorkingSet

    ws = WorkingSet(tokens=1000, at_s=0.0, num_live=1, unshared_tokens=1000, num_sessions=10, num_calls=10,
                    prompt_tokens=10_000, ideal_hit_tokens=5000, ideal_hit_rate=0.5, max_request_tokens=1000,
                    nominal_duration_s=10.0)
    base = run_row(ReplayResult(hints=False, wall_s=1.0, calls=_calls(slow_fail=False)), {}, ws)
    hinted = run_row(ReplayResult(hints=True, wall_s=1.0, calls=_calls(slow_fail=True)), {}, ws)
    assert hinted["errors"] == 5  # half the hinted run's calls never got an answer
    goals = compute_goals(base, hinted)
    for g in goals.values():  # over the five that answered it would read 2.0x hits and -90% TTFT: "met"
        assert not g["met"] and g["reason"] == "sam: 5 of 10 calls errored (more than 1%)", goals
    assert goals["hit_rate_ratio"]["measured"] == pytest.approx(2.0)  # the figures stay for the table
    clean = compute_goals(base, run_row(ReplayResult(hints=True, wall_s=1.0, calls=_calls(False)), {}, ws))
    assert "reason" not in clean["hit_rate_ratio"]


def test_pool_goals_are_void_over_a_run_with_errored_calls():
    from hintkv.bench.pool import compute_goals

    lru = {"calls": 200, "errors": 0, "hit_rate": 0.5, "pool_peak_bytes": 100}
    spm = {"calls": 200, "errors": 2, "hit_rate": 0.5, "pool_peak_bytes": 50}
    assert all(g["met"] and "reason" not in g for g in compute_goals(lru, spm).values())  # 1%: within
    spm["errors"] = 3
    for g in compute_goals(lru, spm).values():
        assert not g["met"] and g["reason"] == "spm: 3 of 200 calls errored (more than 1%)"


def test_swarm_live_goals_are_void_over_a_run_with_errored_calls():
    from hintkv.bench.swarm_goals import compute_goals

    lru = {"calls": 100, "errors": 0, "hit_rate": 0.3, "ttft_mean_s": 2.0, "e2e_task_mean_s": 20.0}
    sam = {"calls": 100, "errors": 0, "hit_rate": 0.6, "ttft_mean_s": 0.5, "e2e_task_mean_s": 10.0}
    live = {"lru": lru, "lru+host": dict(lru), "sam+host": sam}
    goals = compute_goals(live, {}, {}, [])
    timed = ("hit_rate_ratio", "ttft_reduction_vs_lru", "ttft_reduction_vs_lru_host", "task_e2e_reduction_vs_lru")
    assert all(goals[k]["met"] for k in timed), goals
    live["lru+host"]["errors"] = 40
    goals = compute_goals(live, {}, {}, [])
    assert not goals["ttft_reduction_vs_lru_host"]["met"]
    assert goals["ttft_reduction_vs_lru_host"]["reason"] == "lru+host: 40 of 100 calls errored (more than 1%)"
    assert all(goals[k]["met"] for k in timed if k != "ttft_reduction_vs_lru_host")  # they read other runs
    sam["errors"] = 2
    assert not any(compute_goals(live, {}, {}, [])[k]["met"] for k in timed)


def test_an_errored_live_call_is_a_miss_in_the_hit_rate():
    from hintkv.workload.live import LiveResult
    from hintkv.workload.records import CallRecord

    ok = CallRecord("t", "s", 0, 0.0, ttft_s=0.1, prompt_tokens=100, cached_tokens=80)
    failed = CallRecord("t", "s", 1, 0.0, prompt_tokens=100, cached_tokens=None, error="ReadTimeout")
    r = LiveResult(hints=True, calls=[ok, failed])
    assert r.prompt_tokens == 200 and r.cached_tokens == 80 and r.hit_rate == pytest.approx(0.4)
