"""HINTKV_CPU_KEEPER (engine/cpu_keeper.py): idle-priority spinners that run only while a step runs, one set a
process held by a count of running steps, never spinning at a normal priority, and under auto (the default) not while
the engine thread waits for a CPU; an engine with them gives the same tokens and holds them across its forward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from hintkv.config import EngineConfig
from hintkv.engine import cpu_keeper
from hintkv.engine.cpu_keeper import CpuKeeper
from hintkv.models.team_choice import ContentionGate
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, SamplingParams

needs_ext = pytest.mark.skipif(cpu_keeper._ops() is None, reason="no C++ compiler for the keeper extension")


def test_auto_by_default_and_refuses_an_unknown_value(monkeypatch):
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "0")
    assert CpuKeeper.build("cpu") is None
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "1")
    assert CpuKeeper.build("cuda") is None  # CPU engines only
    monkeypatch.delenv("HINTKV_CPU_KEEPER", raising=False)
    assert cpu_keeper.wanted() == "auto"
    for bad in ("yes", "2"):
        monkeypatch.setenv("HINTKV_CPU_KEEPER", bad)
        with pytest.raises(ValueError, match="HINTKV_CPU_KEEPER must be 0, 1 or auto"):
            CpuKeeper.build("cpu")


@needs_ext
def test_auto_holds_the_keepers_only_while_the_engines_gate_reads_free(monkeypatch):
    """auto reads the engine's gate (which the engine ticks): contended steps run without the hold, and a reading
    under free_share brings it back; auto without a gate is refused."""
    monkeypatch.delenv("HINTKV_CPU_KEEPER", raising=False)
    with pytest.raises(ValueError, match="contention gate"):
        CpuKeeper.build("cpu")
    shares = iter([0.9, 0.2, 0.05])
    gate = ContentionGate(lambda: next(shares), check_every=1)
    keeper = CpuKeeper.build("cpu", gate=gate)
    assert keeper is not None and keeper.gate is gate
    held = []
    for _ in range(3):
        gate.tick()  # the engine's part, once a step
        with keeper.step():
            held.append(keeper.stats()[2])
    assert held == [0, 0, 1] and keeper.num_gated == 2  # 0.9: off; 0.2: still off (hysteresis); 0.05: back
    _wait(lambda: keeper.stats()[2] == 0)


def test_keepers_go_one_per_cpu_when_the_cpus_are_known():
    allowed = sorted(os.sched_getaffinity(0))
    assert cpu_keeper.keeper_cpus(2, bound=[1, 0]) == [1, 0]
    assert cpu_keeper.keeper_cpus(len(allowed)) == allowed
    assert cpu_keeper.keeper_cpus(len(allowed) + 1) == [-1] * (len(allowed) + 1)  # left to the OS


def _wait(cond, timeout=20.0):  # a SCHED_IDLE keeper on a loaded box waits for an idle moment
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


@needs_ext
def test_a_keeper_that_cannot_take_its_policy_never_spins_and_none_is_built():
    """A keeper whose policy switch fails must not spin at a normal priority (review_keeper21 finding 2: that
    doubled a 512 prefill): its set exits, keeper_start raises, and build warns and returns None. In a fresh process:
    a running set is returned as it is (one a process), and engines start one by default."""
    code = textwrap.dedent("""
        import os
        os.environ["HINTKV_CPU_KEEPER"] = "1"
        from hintkv.engine import cpu_keeper
        from hintkv.engine.cpu_keeper import CpuKeeper
        try:
            CpuKeeper(cpu_keeper._ops(), [-1], policy=12345)  # no such policy: EINVAL in every keeper thread
        except RuntimeError as e:
            assert "could not take its policy" in str(e), e
        else:
            raise SystemExit("started")
        CpuKeeper.__init__.__defaults__ = (12345, None)
        assert CpuKeeper.build("cpu") is None and not cpu_keeper.started
        print("none built")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "none built" in out.stdout, out.stderr[-2000:]


@needs_ext
def test_keepers_are_idle_priority_on_their_cpus_and_spin_only_while_held(monkeypatch):
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "1")
    keeper = CpuKeeper.build("cpu")
    assert keeper is not None and keeper.tids and len(keeper.tids) == len(keeper.cpus)
    for tid, cpu in zip(keeper.tids, keeper.cpus):
        assert os.sched_getscheduler(tid) == os.SCHED_IDLE
        if cpu >= 0:
            assert os.sched_getaffinity(tid) == {cpu}
    n = len(keeper.tids)
    _wait(lambda: keeper.stats()[2] == 0)
    time.sleep(cpu_keeper.LINGER_S * 5)
    sleeps = keeper.stats()[1]
    with keeper.step():
        assert keeper.stats()[2] == 1
        spins = keeper.stats()[0]
        _wait(lambda: keeper.stats()[0] > spins)  # held: spinning
        with keeper.step():  # a second engine of the process: leaving it does not end the first one's hold
            pass
        assert keeper.stats()[2] == 1
        time.sleep(cpu_keeper.LINGER_S * 5)
        spins = keeper.stats()[0]
        _wait(lambda: keeper.stats()[0] > spins)
    # LINGER_S after the last holder left they sleep again (each once more), then no spin over a later stretch
    _wait(lambda: keeper.stats()[1] - sleeps >= n)
    spins = keeper.stats()[0]
    time.sleep(0.05)
    assert keeper.stats()[0] == spins
    assert CpuKeeper.build("cpu").tids == keeper.tids  # one set a process
    with pytest.raises(RuntimeError, match="other CPUs"):
        CpuKeeper(cpu_keeper._ops(), keeper.cpus + [-1])


def test_the_linger_is_read_from_the_environment_and_bad_values_refused(monkeypatch):
    monkeypatch.delenv("HINTKV_CPU_KEEPER_LINGER_MS", raising=False)
    assert cpu_keeper.linger_s() == cpu_keeper.LINGER_S
    monkeypatch.setenv("HINTKV_CPU_KEEPER_LINGER_MS", "1000")
    assert cpu_keeper.linger_s() == 1.0
    for bad in ("-1", "soon", "20000", "nan"):
        monkeypatch.setenv("HINTKV_CPU_KEEPER_LINGER_MS", bad)
        with pytest.raises(ValueError, match="HINTKV_CPU_KEEPER_LINGER_MS"):
            cpu_keeper.linger_s()


@needs_ext
def test_a_lingering_keeper_yields_its_cpu_to_any_other_thread_and_stops_spinning():
    """After the last step the keepers linger (here 10 s) only on CPUs nothing else wants: a busy process on each
    keeper's CPU (this session's, where a SCHED_IDLE keeper gets ~0.3% against it; another session's would leave it
    ~half) ends every keeper's linger (a yield each), and they spin no more until the next step. In a fresh process,
    whose keeper set is its own."""
    code = textwrap.dedent("""
        import os, subprocess, sys, time
        os.environ["HINTKV_CPU_KEEPER"] = "1"
        os.environ["HINTKV_CPU_KEEPER_LINGER_MS"] = "10000"
        from hintkv.engine.cpu_keeper import CpuKeeper
        keeper = CpuKeeper.build("cpu")
        assert keeper is not None
        n = len(keeper.tids)
        with keeper.step():
            pass
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n + 1)]
        try:
            end = time.monotonic() + 60
            while keeper.stats()[3] < n:
                assert time.monotonic() < end, f"no yield: {keeper.stats()}"
                time.sleep(0.01)
        finally:
            for p in busy:
                p.kill()
                p.wait()
        spins = keeper.stats()[0]
        time.sleep(0.2)  # the linger's 10 s are not over: yielded keepers sleep until the next step
        assert keeper.stats()[0] == spins and keeper.stats()[3] == n, keeper.stats()
        with keeper.step():
            end = time.monotonic() + 60
            while keeper.stats()[0] == spins:  # the next step holds them again
                assert time.monotonic() < end, "no spin in the next step"
                time.sleep(0.01)
        print("yielded")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "yielded" in out.stdout, out.stderr[-2000:]


def _greedy(engine: LLMEngine) -> list[int]:
    engine.add_request(GenerateRequest("r", list(range(100, 400)), SamplingParams(temperature=0, max_tokens=6,
                                                                                  ignore_eos=True)))
    tokens: list[int] = []
    while engine.has_work():
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens


@needs_ext
def test_an_engine_with_keepers_gives_the_same_tokens_and_holds_them_across_its_forward(monkeypatch):
    cfg = dict(model="dummy:tiny", dtype="float32", kv_cache_tokens=4096, max_model_len=1024)
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "0")
    plain = LLMEngine(EngineConfig(**cfg))
    assert plain.keeper is None
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "1")
    kept = LLMEngine(EngineConfig(**cfg))
    assert kept.keeper is not None
    held: list[int] = []
    run = kept.runner.run

    def run_held(*args, **kwargs):  # the forward runs inside the hold, not after it
        held.append(kept.keeper.stats()[2])
        return run(*args, **kwargs)

    monkeypatch.setattr(kept.runner, "run", run_held)
    assert _greedy(kept) == _greedy(plain)
    assert held and all(h >= 1 for h in held)
    assert kept.keeper.stats()[2] == 0


@needs_ext
def test_the_engine_owns_one_gate_that_its_keepers_and_decode_team_read():
    """(review_lead22 findings 3-4, review_auto21 finding 4) In a fresh process with both switches unset (auto, what
    ships): the engine builds one ContentionGate over its thread's RunqueueWait at ContentionGate's settings, hands
    it to the model (the decode team's chooser) and to the keepers, and ticks it once a forward on the stepping
    thread; a contended reading then gates the keepers and runs the decode steps in the regions, with the tokens of
    an engine with both off."""
    code = textwrap.dedent("""
        import json, os, threading
        for name in ("HINTKV_CPU_KEEPER", "HINTKV_DECODE_TEAM"):
            os.environ.pop(name, None)
        from hintkv.config import EngineConfig
        from hintkv.engine.llm_engine import LLMEngine
        from hintkv.engine.types import GenerateRequest, SamplingParams
        from hintkv.models.team_choice import ContentionGate, RunqueueWait

        def greedy(engine):
            engine.add_request(GenerateRequest("r", list(range(100, 400)),
                                               SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)))
            tokens, steps = [], 0
            while engine.has_work():
                steps += 1
                for out in engine.step():
                    tokens += out.new_token_ids
            return tokens, steps

        cfg = dict(model="dummy:tiny", dtype="float32", kv_cache_tokens=4096, max_model_len=1024)
        engine = LLMEngine(EngineConfig(**cfg))
        gate, model = engine.gate, engine.runner.model
        out = dict(reader=isinstance(gate.contention, RunqueueWait), every=gate.check_every,
                   model=model.contention_gate is gate, keeper=engine.keeper is not None and engine.keeper.gate is gate)
        tids = []

        def contended():  # the engine thread waits for a CPU most of its time
            tids.append(threading.get_native_id())
            return 0.9

        gate.contention = contended
        tokens, steps = greedy(engine)
        chooser = model._decode_layers.chooser
        out.update(steps=steps, ticks=gate.num_ticks, reads=len(tids), on_this_thread=set(tids) == {threading.get_native_id()},
                   contended=gate.contended, gated=engine.keeper.num_gated, chooser_steps=chooser.num_steps,
                   chooser_contended=chooser.num_contended)
        os.environ["HINTKV_CPU_KEEPER"] = os.environ["HINTKV_DECODE_TEAM"] = "0"
        out["same_tokens"] = greedy(LLMEngine(EngineConfig(**cfg)))[0] == tokens
        print(json.dumps(out))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("HINTKV_CPU_KEEPER", "HINTKV_DECODE_TEAM")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    every = ContentionGate.CHECK_EVERY
    assert out["reader"] and out["every"] == every and out["model"] and out["keeper"]
    assert out["ticks"] == out["steps"] == 40 and out["on_this_thread"]  # one prefill step, 39 decode steps
    assert out["reads"] == 1 + out["steps"] // every  # the baseline at the first tick, then every 16th
    gated = out["steps"] - every + 1  # from the step whose reading flipped it
    assert out["contended"] and out["gated"] == gated
    assert out["chooser_steps"] == out["steps"] - 1 and out["chooser_contended"] == gated
    assert out["same_tokens"]
