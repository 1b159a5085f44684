"""In-process measurements in process CPU time build their engines without CPU keepers
(`engine.cpu_keeper.keepers_off`): the keepers' SCHED_IDLE spin is this process's CPU time too,
so it would read as the engine's (review_lead22 finding 2: 1.15x the engine thread's own time
with keepers always on). Checked with HINTKV_CPU_KEEPER=1 exported, the mode that always starts them."""

from __future__ import annotations

import os

import pytest

from hintkv.engine.cpu_keeper import CpuKeeper, keepers_off


def test_keepers_off_builds_none_and_restores_the_callers_setting(monkeypatch):
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "1")
    with keepers_off():
        assert CpuKeeper.build("cpu") is None
    assert os.environ["HINTKV_CPU_KEEPER"] == "1"
    monkeypatch.delenv("HINTKV_CPU_KEEPER")
    with keepers_off():
        pass
    assert "HINTKV_CPU_KEEPER" not in os.environ


@pytest.mark.parametrize("cpu_time", [True, False])
def test_calibrate_in_cpu_time_runs_without_keepers(monkeypatch, cpu_time):
    from hintkv.engine import cpu_keeper
    from hintkv.sim.calibrate import _Rig

    built = []
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "1")
    monkeypatch.setattr(cpu_keeper.CpuKeeper, "build",  # the mode each engine's build saw
                        classmethod(lambda cls, *a, **k: built.append(cpu_keeper.wanted())))
    _Rig("dummy:tiny", 256, 256, 0, cpu_time=cpu_time)
    assert built == (["0"] if cpu_time else ["1"])


def test_spec_decode_engines_run_without_keepers(monkeypatch):
    from hintkv.bench.spec_decode import make_engine
    from hintkv.engine import cpu_keeper

    built = []
    monkeypatch.setenv("HINTKV_CPU_KEEPER", "1")
    monkeypatch.setattr(cpu_keeper.CpuKeeper, "build",
                        classmethod(lambda cls, *a, **k: built.append(cpu_keeper.wanted())))
    make_engine(None, 4, 1024, model="dummy:tiny")
    assert built == ["0"]
    assert os.environ["HINTKV_CPU_KEEPER"] == "1"
