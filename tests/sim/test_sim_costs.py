"""The cost model reproduces the calibration points it was built from, and behaves between them."""

from __future__ import annotations

import json

import pytest

from hintkv.sim.costs import CostModel
from hintkv.sim.profile import CALIBRATION, Profile, load_profile


def test_h200_8b_reproduces_every_calibration_point():
    cal = json.loads(CALIBRATION.read_text())["llama3_8b"]
    cm = CostModel(load_profile("h200-llama3-8b"))
    for key, ms in cal["prefill_ms_new_tokens_on_cached_prefix"].items():
        new, cached = (int(x.removeprefix("new").removeprefix("cached")) for x in key.split("_"))
        assert cm.prefill_ms(new, cached) == pytest.approx(ms, rel=1e-9), key
    for n, ms in cal["prefill_ms_cold"].items():  # 512 and 2048 were measured twice (2.6%, 3.3%)
        assert cm.prefill_ms(int(n)) == pytest.approx(ms, rel=0.035), n
    for key, ms in cal["decode_step_ms"].items():
        b, c = (int(x.removeprefix("batch").removeprefix("ctx")) for x in key.split("_"))
        assert cm.decode_ms(b, c) == pytest.approx(ms, rel=1e-9), key
    for n, ms in cal["reload_prefix_from_pinned_host_ms"].items():  # a latency + bandwidth fit
        assert cm.tokens_ms("host", "device", int(n)) == pytest.approx(ms, rel=0.03), n


def test_h200_70b_keeps_the_measured_70b_points_times_eight():
    cal = json.loads(CALIBRATION.read_text())["llama3_70b_shape"]["measured_on_10_of_80_layers_ms"]
    cm = CostModel(load_profile("h200-llama3-70b"))
    assert cm.prefill_ms(2048) == pytest.approx(8 * cal["prefill2048"])
    assert cm.prefill_ms(8192) == pytest.approx(8 * cal["prefill8192"])
    assert cm.prefill_ms(512, 8192) == pytest.approx(8 * cal["new512_cached8192"])
    assert cm.decode_ms(1, 8192) == pytest.approx(8 * cal["decode_b1_ctx8192"])
    cm8 = CostModel(load_profile("h200-llama3-8b"))
    for new, cached in [(128, 0), (512, 2048), (2048, 32768), (4000, 50000)]:
        assert cm.prefill_ms(new, cached) > 4 * cm8.prefill_ms(new, cached)


@pytest.mark.parametrize("name", ["h200-llama3-8b", "h200-llama3-70b"])
def test_monotone_between_and_beyond_points(name):
    cm = CostModel(load_profile(name))
    for cached in (0, 1000, 8192, 20000, 100_000, 200_000):
        prev = 0.0
        for new in (1, 64, 128, 300, 512, 1000, 2048, 5000, 8192, 40_000):
            t = cm.prefill_ms(new, cached)
            assert t >= prev, (new, cached)
            prev = t
    for new in (128, 700, 2048, 3000):
        assert cm.prefill_ms(new, 200_000) > cm.prefill_ms(new, 32768) > cm.prefill_ms(new, 0)
    assert cm.decode_ms(16, 100_000) > cm.decode_ms(16, 8192)
    assert cm.decode_ms(64, 8192) >= cm.decode_ms(16, 8192)


def test_mixed_step_and_copies():
    cm = CostModel(load_profile("h200-llama3-8b"))
    alone = cm.step_ms([(2048, 8192)])
    assert alone == pytest.approx(cm.prefill_ms(2048, 8192))
    assert cm.step_ms([(2048, 8192)], [30_000] * 8) > alone
    assert cm.step_ms([], [8192] * 8) == pytest.approx(cm.decode_ms(8, 8192))
    assert cm.transfer_ms("host", "device", 0) == 0
    gb = cm.transfer_ms("device", "host", 10**9)
    assert gb == pytest.approx(1000 / 55.3, rel=0.02)
    assert cm.exposed_copy_ms(gb) < 0.2 * gb  # the calibration shows the reload hides behind compute


def test_a_decode_step_from_its_batch_and_context_sum_is_the_step_exactly():
    """`decode_step_ms(batch, sum)` is what a decode stretch asks per step; it must be
    `step_ms((), contexts)` to the last bit, or a stretch's report drifts from stepping each."""
    import random

    rnd = random.Random(7)
    for name in ("h200-llama3-8b", "h200-llama3-70b"):
        cm = CostModel(load_profile(name))
        for _ in range(300):
            ctx = [rnd.randrange(1, 400_000) for _ in range(rnd.randrange(1, 300))]
            want = cm.profile.step_overhead_ms + cm.decode_ms(len(ctx), sum(ctx) // len(ctx))
            assert cm.decode_step_ms(len(ctx), sum(ctx)) == cm.step_ms((), ctx) == want
        assert cm.decode_step_ms(0, 0) == cm.step_ms((), ()) == 0.0


def test_a_decode_stretchs_steps_are_each_step_exactly():
    """`decode_steps_ms` (a stretch's later steps at once) gives `decode_step_ms` of each step to the
    last bit: inside the grid, past its largest context, and across it."""
    import random

    rnd = random.Random(11)
    for name in ("h200-llama3-8b", "h200-llama3-70b"):
        cm = CostModel(load_profile(name))
        last = cm._ctxs[-1]
        starts = [rnd.randrange(1, 400_000) for _ in range(100)] + [last - 5, last - 1, last, last + 1, 1]
        for first in starts:
            batch, count = rnd.randrange(1, 300), rnd.randrange(0, 64)
            total = first * batch + rnd.randrange(batch)  # a mean context of `first`
            want = [cm.decode_step_ms(batch, total + i * batch) for i in range(count)]
            assert cm.decode_steps_ms(batch, total, count) == want, (name, first, batch, count)
        assert cm.decode_steps_ms(0, 0, 3) == [0.0] * 3


def test_profile_round_trips_through_json(tmp_path):
    p = load_profile("h200-llama3-70b")
    p.save(tmp_path / "p.json")
    q = load_profile(str(tmp_path / "p.json"))
    assert q == p
    with pytest.raises(ValueError, match="unknown profile"):
        load_profile("nope")
    with pytest.raises(ValueError, match="cold prefill"):
        Profile("x", "y", 1, [(1, 5, 1.0)], [(1, 1, 1.0)])


def test_sim_profiles_command_prints_every_builtin(capsys):
    from hintkv.cli import main

    assert main(["sim", "profiles"]) == 0
    out = capsys.readouterr().out
    assert "h200-llama3-8b" in out and "h200-llama3-70b" in out


def test_idle_wakeup_is_charged_once_per_wake_and_never_to_a_busy_engine():
    """A lone request on an idle engine pays the profile's wake-up on its first step only; a
    request that arrives while the engine steps another pays none."""
    from dataclasses import replace

    from hintkv.config import EngineConfig
    from hintkv.sim.clock import EventClock
    from hintkv.sim.engine import SimEngine

    def run(wakeup_ms: float) -> dict[str, tuple[float, float]]:
        base = load_profile("h200-llama3-8b")
        cm = CostModel(replace(base, idle_wakeup_ms=wakeup_ms, extra=dict(base.extra)))
        clock = EventClock()
        eng = SimEngine(EngineConfig(model="sim", block_size=16, kv_cache_tokens=8192), cm, clock, 512)
        out: dict[str, list[float]] = {}

        def send(rid: str, n: int) -> None:
            t0 = clock()
            out[rid] = []
            eng.submit(rid, list(range(7, 7 + n)), 8, None, lambda t: out[rid].append(t - t0),
                       lambda o, w: out[rid].append(clock() - t0))

        send("lone", 300)
        clock.at(1.0, lambda: send("first", 2000))
        clock.at(1.0 + 1e-6, lambda: send("busy", 300))  # arrives while "first" is stepping
        while clock.run_next():
            pass
        return {k: tuple(v) for k, v in out.items()}

    plain, woken = run(0.0), run(40.0)
    assert woken["lone"][0] - plain["lone"][0] == pytest.approx(0.040)  # TTFT: the first step
    assert woken["lone"][1] - plain["lone"][1] == pytest.approx(0.040)  # and no later step
    assert woken["first"][1] - plain["first"][1] == pytest.approx(0.040)
    assert woken["busy"][0] - plain["busy"][0] == pytest.approx(0.040)  # only the wait behind "first"


def test_idle_wakeup_round_trips_and_defaults_to_zero(tmp_path):
    p = load_profile("h200-llama3-8b")
    assert p.idle_wakeup_ms == 0.0
    d = p.to_json()
    d["idle_wakeup_ms"] = 12.5
    assert Profile.from_json(d).idle_wakeup_ms == 12.5
    d.pop("idle_wakeup_ms")
    assert Profile.from_json(d).idle_wakeup_ms == 0.0


def test_calibrate_in_cpu_time_runs_on_one_thread_and_says_so(capsys):
    """`--cpu-time`: each step timed in process CPU time on ONE torch thread (restored after), and
    the profile records how it was timed; `--server` cannot be timed that way (exit 2)."""
    import torch

    from hintkv.sim.calibrate import calibrate, main

    grid = {"new": (16, 64), "cached": (0,), "batch": (1,), "context": (64,), "repeats": 1}
    before = torch.get_num_threads()
    seen: list[int] = []
    prof = calibrate("dummy:tiny", grid=grid, cpu_time=True, progress=lambda _: seen.append(torch.get_num_threads()))
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before
    assert "process CPU time, 1 torch thread" in prof.source and prof.extra["timing"] == "cpu"
    assert all(ms > 0 for _, _, ms in prof.prefill_points) and prof.decode_points[0][2] > 0
    assert main(["--cpu-time", "--server", "http://127.0.0.1:9"]) == 2


def _bad(d: dict, field: str, value) -> dict:
    d = json.loads(json.dumps(d))
    if field in ("prefill_points", "decode_points"):
        d[field][0][2] = value
    elif field == "gbps":
        d["links"][next(iter(d["links"]))]["gbps"] = value
    else:
        d[field] = value
    return d


@pytest.mark.parametrize("field,value", [("prefill_points", float("nan")), ("prefill_points", 0.0),
                                         ("decode_points", -1.0), ("decode_points", float("inf")),
                                         ("gbps", 0), ("gbps", float("nan")), ("step_overhead_ms", -0.5),
                                         ("idle_wakeup_ms", float("nan")), ("device_kv_tokens", -1)])
def test_a_profile_refuses_a_cost_that_is_not_a_finite_positive_time(field, value):
    """Review rev27 A4 / B1: NaN, zero, negative or infinite costs were accepted (a NaN even passed
    `non_monotone`, and the TTFT goal then read `reachable: false` from a NaN bound)."""
    d = load_profile("h200-llama3-8b").to_json()
    with pytest.raises(ValueError, match=field if field != "gbps" else "gbps"):
        Profile.from_json(_bad(d, field, value))


def test_sim_with_a_bad_profile_file_exits_2_naming_the_file_and_the_field(tmp_path, capsys):
    from hintkv.sim.run import main

    d = load_profile("h200-llama3-8b").to_json()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_bad(d, "decode_points", float("nan"))))
    assert main(["--profile", str(bad), "--quick"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "decode_points" in err and "Traceback" not in err
    del d["decode_points"]
    bad.write_text(json.dumps(d))
    assert main(["--profile", str(bad), "--quick"]) == 2
    assert "missing field 'decode_points'" in capsys.readouterr().err
