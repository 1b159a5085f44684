"""The C++ extensions' build name: one per source, flags, torch installation and CPU (`models/cpu_ext.py`)."""

from __future__ import annotations

import os
import platform

from hintkv.models.cpu_ext import build_tag, cpu_flags


def test_each_torch_installation_builds_its_own_extension():
    tag = build_tag("src", ["-O3"], "/venv-a/torch", "avx2")
    assert tag == build_tag("src", ["-O3"], "/venv-a/torch", "avx2")  # the same venv reuses its build
    assert tag != build_tag("src", ["-O3"], "/venv-b/torch", "avx2")  # another venv never rewrites it
    assert tag != build_tag("src2", ["-O3"], "/venv-a/torch", "avx2")
    assert tag != build_tag("src", ["-O2"], "/venv-a/torch", "avx2")
    assert build_tag("ab", ["c"], "d", "e") != build_tag("a", ["bc"], "d", "e")  # fields are delimited


def test_each_cpu_builds_its_own_extension():
    """-march=native builds: a cache shared with a CPU of other features (an AMX build on a CPU without
    AMX) must not load the other's .so, so the tag changes with the CPU's flags."""
    sapphire = "fpu avx2 avx512f avx512_vnni amx_tile amx_int8"
    ice_lake = "fpu avx2 avx512f avx512_vnni"
    assert build_tag("src", ["-march=native"], "/t", sapphire) != build_tag("src", ["-march=native"], "/t", ice_lake)
    assert build_tag("src", ["-march=native"], "/t", "avx2") != build_tag("src", ["-march=native"], "/t", "")
    flags = cpu_flags()  # this machine's: read once, the same every call
    assert flags == cpu_flags()
    if platform.machine() == "x86_64" and os.path.exists("/proc/cpuinfo"):
        assert "fpu" in flags.split()  # the flags line itself, not "" (which would tag every CPU alike)
