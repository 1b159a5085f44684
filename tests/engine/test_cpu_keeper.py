"""HINTKV_CPU_KEEPER (engine/cpu_keeper.py): idle-priority spinners that run only while a step runs, and an engine
with them gives the same tokens."""

from __future__ import annotations

import os
import time

import pytest

from hintkv.config import EngineConfig
from hintkv.engine import cpu_keeper
from hintkv.engine.cpu_keeper import CpuKeeper
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, SamplingParams

needs_ext = pytest.mark.skipif(cpu_keeper._ops() is None, reason="no C++ compiler for the keeper extension")


def test_off_by_default_and_refuses_an_unknown_value(monkeypatch):
    monkeypatch.delenv("HINTKV_CPU_KEEPER", raising=False)
    assert CpuKeeper.build("cpu") is None
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "0")
    assert CpuKeeper.build("cpu") is None
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "1")
    assert CpuKeeper.build("cuda") is None  # CPU engines only
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "yes")
    with pytest.raises(ValueError, match="HINTKV_CPU_KEEPER"):
        CpuKeeper.build("cpu")


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
def test_keepers_are_idle_priority_and_spin_only_while_held(monkeypatch):
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "1")
    keeper = CpuKeeper.build("cpu")
    assert keeper is not None and keeper.tids
    for tid in keeper.tids:
        assert os.sched_getscheduler(tid) == os.SCHED_IDLE
    _wait(lambda: keeper.stats()[1] >= len(keeper.tids))  # every keeper asleep on the futex at first
    with keeper.step():
        spins = keeper.stats()[0]
        _wait(lambda: keeper.stats()[0] > spins)  # held: spinning
    # LINGER_S after the step they sleep again: no spin counted over a later stretch
    _wait(lambda: keeper.stats()[1] >= 2 * len(keeper.tids))
    spins = keeper.stats()[0]
    time.sleep(0.05)
    assert keeper.stats()[0] == spins
    assert CpuKeeper.build("cpu").tids == keeper.tids  # started once per process


def _greedy(engine: LLMEngine) -> list[int]:
    engine.add_request(GenerateRequest("r", list(range(100, 400)), SamplingParams(temperature=0, max_tokens=6,
                                                                                  ignore_eos=True)))
    tokens: list[int] = []
    while engine.has_work():
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens


@needs_ext
def test_an_engine_with_keepers_gives_the_same_tokens(monkeypatch):
    cfg = dict(model="dummy:tiny", dtype="float32", kv_cache_tokens=4096, max_model_len=1024)
    monkeypatch.delenv("HINTKV_CPU_KEEPER", raising=False)
    plain = LLMEngine(EngineConfig(**cfg))
    assert plain.keeper is None
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "1")
    kept = LLMEngine(EngineConfig(**cfg))
    assert kept.keeper is not None
    spins = kept.keeper.stats()[0]
    assert _greedy(kept) == _greedy(plain)
    assert kept.keeper.stats()[0] > spins  # its steps held the keepers
