"""The C++ extensions' build name: one per source, flags, torch installation and CPU (`models/cpu_ext.py`)."""

from __future__ import annotations

import os
import platform

from hintkv.models.cpu_ext import build_directory, build_tag, clear_stale_baton, cpu_flags


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


def test_a_build_lock_left_by_a_killed_build_is_removed_under_the_flock(tmp_path, monkeypatch):
    """torch's `lock` file outlives a killed build and every later load waited on it forever; the
    loader, holding the flock of the folder torch builds in, removes that folder's stale `lock` and
    nothing else. The folder is torch's own (`TORCH_EXTENSIONS_DIR` as given, else its root +
    py*_cpu): two processes naming the root differently build — and lock — in one folder."""
    import pytest

    mine, other = "hintkv_x_0123456789ab", "hintkv_y_0123456789ab"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    build_dir = build_directory(mine)
    assert build_dir == str(tmp_path / mine)
    (tmp_path / mine / "lock").write_text("")
    (tmp_path / mine / "main.cpp").write_text("")
    (tmp_path / other).mkdir()
    (tmp_path / other / "lock").write_text("")
    with pytest.warns(RuntimeWarning, match="stale build lock"):
        assert clear_stale_baton(build_dir, mine)
    assert not (tmp_path / mine / "lock").exists()
    assert (tmp_path / mine / "main.cpp").exists()  # only the lock goes
    assert (tmp_path / other / "lock").exists()  # another extension's build is not touched
    assert not clear_stale_baton(build_dir, mine)

def test_a_kernel_lets_other_python_threads_run_while_it_runs():
    """Every extension function runs with the GIL released (`bindings`): the server's event loop thread
    streams tokens while the engine thread's kernels run. With forced GIL switches off (a 60 s switch
    interval), a thread calls the C++ gemv again and again and notes when each call began and ended,
    never blocking otherwise; the main thread notes the time and yields the GIL (sleep(0)) in a loop.
    With load_inline's default bindings the main thread ran about once inside a call (measured: 16 times
    in 20 calls, 0-3 in one call; the GIL is let go once or so during a call, and once the kernel thread
    retakes it, it keeps it to the call's end); released, thousands of times (4,682 in 20 calls)."""
    import sys
    import threading
    import time

    import pytest
    import torch

    from hintkv.models import gemv_cpu
    from hintkv.models.cpu_ext import bindings

    assert bindings(["f", "g"]).count("wrap_pybind_function_no_gil(") == 2
    if gemv_cpu.ops() is None:
        pytest.skip("no C++ build here")
    gemv = gemv_cpu.ops().gemv
    x, w, no_bias = torch.randn(12, 2048), torch.randn(4096, 2048), torch.empty(0)  # 32 MB: ms a call
    calls: list[tuple[float, float]] = []
    done = threading.Event()

    def kernel_thread() -> None:
        for _ in range(40):
            t0 = time.perf_counter()
            gemv(x, w, no_bias)
            calls.append((t0, time.perf_counter()))
        done.set()

    ran: list[float] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        th = threading.Thread(target=kernel_thread)
        th.start()
        while not done.is_set():
            ran.append(time.perf_counter())
            time.sleep(0)  # releases the GIL
        th.join()
    finally:
        sys.setswitchinterval(interval)
    assert sum(1 for t0, t1 in calls for m in ran if t0 < m < t1) >= 5 * len(calls)
