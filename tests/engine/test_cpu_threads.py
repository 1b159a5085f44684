"""--cpu-omp-threads-bind (engine/cpu_threads.py): vLLM's VLLM_CPU_OMP_THREADS_BIND semantics, the engine
thread's own OpenMP team pinned, the rest of the process left alone."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
import torch

from hintkv.config import EngineConfig
from hintkv.engine import cpu_threads

ALLOWED = sorted(os.sched_getaffinity(0))


def test_cpu_lists_read_like_linux_cpulists():
    assert cpu_threads.parse_cpu_list("0-2,5") == [0, 1, 2, 5]
    assert cpu_threads.parse_cpu_list("3,1") == [3, 1]  # order kept: thread 0 on CPU 3
    for bad in ("", "a", "2-1", "0,0", "1-", "-1", "0-1,1"):
        with pytest.raises(ValueError, match="cpu_omp_threads_bind"):
            cpu_threads.parse_cpu_list(bad)


def test_the_config_refuses_a_bad_spec_and_defaults_to_nobind():
    assert EngineConfig().cpu_omp_threads_bind == "nobind"
    for ok in ("auto", "nobind", str(ALLOWED[0]), ",".join(map(str, ALLOWED))):
        EngineConfig(cpu_omp_threads_bind=ok)
    with pytest.raises(ValueError, match="cpu_omp_threads_bind"):
        EngineConfig(cpu_omp_threads_bind="all")
    with pytest.raises(ValueError, match="not among"):  # a CPU this process may not use
        EngineConfig(cpu_omp_threads_bind=str(max(ALLOWED) + 1))


def test_serve_refuses_a_cpu_it_may_not_use_before_loading(capsys):
    from hintkv.cli import main

    assert main(["serve", "--cpu-omp-threads-bind", f"0,{max(ALLOWED) + 1}"]) == 2
    assert "not among" in capsys.readouterr().err


def test_serve_has_the_flag():
    from hintkv.cli import build_parser

    args = build_parser().parse_args(["serve", "--cpu-omp-threads-bind", "auto"])
    assert args.cpu_omp_threads_bind == "auto"


def test_auto_takes_one_cpu_per_physical_core(tmp_path):
    # CPUs 0 and 2 share core 0, 1 and 3 share core 1 (Linux's usual SMT numbering); 4 is another package
    topo = {0: ("0", "0"), 1: ("0", "1"), 2: ("0", "0"), 3: ("0", "1"), 4: ("1", "0")}
    for c, (pkg, core) in topo.items():
        d = tmp_path / f"cpu{c}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(pkg + "\n")
        (d / "core_id").write_text(core + "\n")
    assert cpu_threads.physical_cores([0, 1, 2, 3, 4], tmp_path) == [2, 3, 4]  # vLLM's auto: the last sibling
    assert cpu_threads.physical_cores([0, 1], tmp_path) == [0, 1]
    assert cpu_threads.physical_cores([0, 7], tmp_path) == [0, 7]  # unreadable topology: the allowed CPUs


def test_resolve_checks_the_cpus_against_the_process():
    assert cpu_threads.resolve("nobind") is None
    assert cpu_threads.resolve("0-1", allowed=[0, 1, 2]) == [0, 1]
    with pytest.raises(ValueError, match="not among"):
        cpu_threads.resolve("5", allowed=[0, 1])
    auto = cpu_threads.resolve("auto")
    assert auto and set(auto) <= set(ALLOWED)
    assert cpu_threads.engine_cpus("auto", "cuda") is None  # vLLM binds on its CPU backend only


def _in_fresh_thread(fn):
    """fn's result, run on a new thread (its own OpenMP team: the test process's stays unbound)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs")
def test_bind_pins_each_thread_of_the_callers_team_to_its_cpu():
    cpus = [ALLOWED[1], ALLOWED[0]]  # reversed: thread 0 (the caller) on the second CPU

    def work():
        tids = cpu_threads.bind(cpus)
        masks = [os.sched_getaffinity(t) for t in tids]
        a = torch.randn(256, 256)
        product = a @ a  # MKL and ATen run on the bound team
        again = cpu_threads.bind(cpus)  # the same pool: the same threads
        return tids, masks, threading.get_native_id(), torch.allclose(product, (a.double() @ a.double()).float(),
                                                                       atol=1e-3), again
    if cpu_threads._ops() is None:
        pytest.skip("no C++ compiler")
    tids, masks, caller, ok, again = _in_fresh_thread(work)
    assert tids[0] == caller and len(set(tids)) == 2
    assert masks == [{cpus[0]}, {cpus[1]}]
    assert ok and again == tids
    assert os.sched_getaffinity(0) == set(ALLOWED)  # this (main) thread untouched


def test_the_engine_thread_is_bound_when_asked():
    from hintkv.engine.async_llm import AsyncLLM

    if cpu_threads._ops() is None:
        pytest.skip("no C++ compiler")
    cpu = ALLOWED[-1]
    engine = AsyncLLM.from_config(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu",
                                               kv_cache_tokens=1024, max_model_len=256,
                                               cpu_omp_threads_bind=str(cpu)))
    try:
        engine.call(lambda e: None).result(60)  # the loop binds before its first job
        assert len(engine.bound_tids) == 1
        assert engine.bound_tids[0] == engine._thread.native_id
        assert os.sched_getaffinity(engine.bound_tids[0]) == {cpu}
        assert os.sched_getaffinity(0) == set(ALLOWED)
    finally:
        asyncio.run(engine.shutdown())


_POOL_PROBE = """
import os, threading, time, torch
from hintkv.engine.cpu_threads import on_passing_thread
def threads(): return len(os.listdir("/proc/self/task"))
def region(): return float(torch.ones(1 << 22).exp_().sum())  # ATen's parallel_for: OpenMP regions of 2 threads
before = threads()
builder = on_passing_thread(lambda: (region(), threading.get_native_id())[1])
deadline = time.monotonic() + 30
while threads() > before and time.monotonic() < deadline:  # the pool's worker is told to exit, and exits soon after
    time.sleep(0.01)
after_passing = threads()
region()
print(builder != threading.get_native_id(), before, after_passing, threads())
"""


def test_an_openmp_pool_started_on_a_passing_thread_ends_with_it():
    """`serve` builds its engine on a passing thread so that no second pool outlives the build (libgomp throttles
    every spin to 100 while it manages more threads than CPUs): in a fresh process at 2 OpenMP threads, the
    thread count is back where it was once the passing thread returned, while a region on the main thread leaves
    its pool's worker behind."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", _POOL_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    other_thread, before, after_passing, after_main = out.stdout.split()
    assert other_thread == "True"
    assert int(after_passing) == int(before)
    assert int(after_main) == int(before) + 1


_TIERED_PROBE = """
import asyncio, os, threading
from hintkv.cache.types import SessionRef
from hintkv.config import EngineConfig
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.server.launch import start_engine
def native(): return len(set(map(int, os.listdir("/proc/self/task"))) - {t.native_id for t in threading.enumerate()})
engine = start_engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", kv_cache_tokens=128,
                                   max_model_len=256, host_cache_memory="4MiB"))
async def traffic():
    prompts = [[(i * 131 + j) % 200 + 3 for j in range(112)] for i in range(6)] + [None]
    prompts[-1] = prompts[0]  # session 0 again: its blocks come back from the host tier
    for i, prompt in enumerate(prompts):
        req = GenerateRequest(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                              session=SessionRef("t", f"s{i % 6}", f"s{i % 6}"))
        async for _ in engine.generate(req):
            pass
asyncio.run(traffic())
moved = engine.tier_stats()["blocks_moved"]
print(moved.get("device->host", 0), moved.get("host->device", 0), native())
asyncio.run(engine.shutdown())
"""


def test_a_served_engine_with_a_host_tier_has_one_openmp_pool():
    """The property `serve`'s passing thread and the mover's serial threads are for: after start_engine and traffic
    that moves blocks both ways through the host tier, the process's native (non-Python) threads at
    OMP_NUM_THREADS=2 are exactly one more than at 1: the engine thread's pool's one worker. A copy above ATen's grain
    on a mover thread had started a second pool (review_kmend1: 3 such threads, not 2). OPENBLAS_NUM_THREADS=1 keeps
    numpy's OpenBLAS server thread (which follows OMP_NUM_THREADS, and is no libgomp thread) out of the count, and
    HINTKV_CPU_KEEPER=0 the CPU keepers (one native thread per OpenMP thread, engine/cpu_keeper.py)."""
    import subprocess
    import sys

    counts = []
    for omp in (2, 1):
        env = {**os.environ, "OMP_NUM_THREADS": str(omp), "OPENBLAS_NUM_THREADS": "1", "HINTKV_CPU_KEEPER": "0"}
        out = subprocess.run([sys.executable, "-c", _TIERED_PROBE], env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr
        offloaded, loaded, native = map(int, out.stdout.split())
        assert offloaded > 0 and loaded > 0  # the mover copied both ways
        counts.append(native)
    assert counts[0] - counts[1] == 1, counts


def test_serve_builds_its_engine_on_a_passing_thread(monkeypatch):
    from hintkv.server.launch import start_engine

    built_on: list[int] = []
    passing = cpu_threads.on_passing_thread
    monkeypatch.setattr(cpu_threads, "on_passing_thread",
                        lambda fn: passing(lambda: (built_on.append(threading.get_native_id()), fn())[1]))
    engine = start_engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", kv_cache_tokens=256,
                                       max_model_len=128, max_num_seqs=2))
    try:
        assert built_on and built_on[0] != threading.get_native_id()
        assert engine.call(lambda e: e.has_work()).result(60) is False  # its engine thread runs it
    finally:
        asyncio.run(engine.shutdown())


_INTERRUPT_PROBE = """
import signal, sys, threading
# a shell's background job (CI started with `&`) starts children with SIGINT ignored; at a terminal Python installs
# default_int_handler itself: the probe restores it
signal.signal(signal.SIGINT, signal.default_int_handler)
from hintkv.engine.cpu_threads import on_passing_thread
def build():
    print("building", flush=True)
    threading.Event().wait()  # a build that does not end by itself
try:
    on_passing_thread(build)
except KeyboardInterrupt:  # as hintkv.cli.main ends serve: a non-daemon build thread would now hold the exit
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_during_the_build_leaves_without_waiting_for_it():
    """SIGINT while `serve` builds its engine on the passing thread: the caller raises KeyboardInterrupt and the
    process exits; the build thread (a daemon) is not joined (a ThreadPoolExecutor's exit joined it: here, forever)."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _INTERRUPT_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "building"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and out.strip() == "interrupted"


def test_the_passing_thread_is_a_daemon():
    """A daemon: the interpreter's exit does not wait for a build that an interrupt left running."""
    assert cpu_threads.on_passing_thread(lambda: threading.current_thread().daemon) is True


def test_the_passing_threads_result_and_error_come_back_to_the_caller():
    assert cpu_threads.on_passing_thread(lambda: threading.get_native_id()) != threading.get_native_id()
    with pytest.raises(ZeroDivisionError):
        cpu_threads.on_passing_thread(lambda: 1 / 0)
