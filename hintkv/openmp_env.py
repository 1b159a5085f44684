"""The process's OpenMP settings: how long an idle OpenMP thread spins before it sleeps (libgomp's short spin, set
before torch loads it), and `serial_openmp_thread()`, which keeps a helper thread's torch ops off OpenMP.

libgomp reads GOMP_SPINCOUNT once, when torch's import loads it. A worker that finished a parallel
region, and the thread that waits for it at the region's end, spin that many times and then sleep
on a futex. libgomp's default is 300,000 spins (milliseconds) while it manages no more threads than
CPUs, 100 once it manages more. A process whose regions all start on one thread (pytest, `python -m
hintkv.bench.*`, the simulator's calibration) has one pool and got the long spin; the server, whose
engine thread is not the main thread, already ran at 100.

Measured (tenth session, dummy:tiny float32, 2 threads; docs/benchmarks/history/engine.md "Tenth session"):
- under load 7.9-9.2, one pool: a decode b1 step 609-1,486 ms with the default spin, 56-61 ms at 100
  (a whole run 55-76 s -> 11-12 s wall, 20-23 s -> 3.9-4.1 s CPU): spinners take the CPUs the other
  threads need;
- on free cores (SCHED_FIFO, interleaved in one process): spinning 2,000 or 10,000 times cut the
  engine's sleeps 2.4-12x and changed no figure by more than the noise (prefill 128 / 512 / 2048,
  decode b1 / b8: 0.94-1.06x): a wake-up is not what a step waits for.
Served (eighteenth session; docs/benchmarks/history/engine.md "Eighteenth session, kmend"): the server built its
engine on the main thread, whose OpenMP pool stayed beside the engine thread's, and libgomp cuts every spin to 100
while it manages more threads than CPUs: GOMP_SPINCOUNT did nothing there (the same context switches per request
at 100 and 100,000). `serve` now builds on a passing thread (engine/cpu_threads.py), and the tier threads (the
mover's copies, the pool tier's worker and calls) run without OpenMP (`serial_openmp_thread`; until the nineteenth
session the mover's first offload started a second pool): the engine thread's pool is the server's only one, and the
value here (or the user's) is the server's too, as long as no other thread runs parallel regions. Servers side by
side, dummy:tiny, 2 threads, bench engine's samples:
- free cores (SCHED_FIFO stretches, 9 rounds): one-pool 100,000 against the one-pool server at 100 gave decode b1
  1.37x, b8 1.05x, cold 128 TTFT 0.89x, prefill 512 0.97x (ms); 10,000: 1.03x, 1.00x, 0.92x, 0.96x. Against the
  two-pool server at 100 (the old `serve`, the only 100 row under load): 100,000 1.33x, 1.09x, 0.93x, 0.94x;
  10,000 1.00x, 1.04x, 0.96x, 0.94x (0-6% better);
- under load 7-10 (4 rounds; against the two-pool server at 100, no one-pool 100 was run): 100,000 gave decode b1
  0.57x, b8 0.73x, cold TTFT 4.1x, prefill 512 2.4x, at twice the CPU per request (taken from the box's other
  users); 10,000: 0.83x, 1.00x, 1.39x, 1.30x (0-39% worse).
So the process keeps libgomp's short spin everywhere, unless the user chose a wait policy (on a box of its own,
GOMP_SPINCOUNT=100000 buys the decode figures above). A peer process that runs its own wait policy
(the bench's vLLM) gets the environment without hintkv's value, and with the user's own when they set
one (`peer_environ`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
from collections.abc import Mapping, MutableMapping

log = logging.getLogger(__name__)

SPIN_COUNT = 100  # libgomp's own value for an oversubscribed process
SET_BY_HINTKV = False  # GOMP_SPINCOUNT in os.environ is hintkv's (True), not the user's


def bound_openmp_spin(env: MutableMapping[str, str] = os.environ) -> None:
    """Set GOMP_SPINCOUNT to `SPIN_COUNT` unless the user chose (GOMP_SPINCOUNT, OMP_WAIT_POLICY). It
    counts only in a process that has not loaded libgomp yet (not imported torch), and children."""
    global SET_BY_HINTKV
    if "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env:
        env["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
        SET_BY_HINTKV = SET_BY_HINTKV or env is os.environ


def peer_environ(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment (or `env`) for a peer process with its own wait policy: without
    the GOMP_SPINCOUNT hintkv set, with the user's own when they set one."""
    env = dict(os.environ if env is None else env)
    if SET_BY_HINTKV:
        env.pop("GOMP_SPINCOUNT", None)
    return env


def serial_openmp_thread() -> None:
    """Make the calling thread's torch ops run without OpenMP (a thread pool's initializer: the tier mover's copy
    threads). libgomp keeps a pool of workers per thread that starts parallel regions, for as long as that thread
    lives, and throttles every spin to 100 while it manages more threads than CPUs: a block copy at or above ATen's
    32,768-element grain on a mover thread started a second pool beside the engine thread's (4 managed threads on
    2 CPUs), so GOMP_SPINCOUNT did not reach a tiered server (review_kmend1). The thread's own OpenMP thread count
    (a per-thread setting: torch.set_num_threads would change the process's) is set to 1 after ATen's per-thread
    lazy init, which would otherwise set it back; ATen's parallel_for then runs serially, no region. Where no OpenMP
    runtime is loaded (torch built without one) there is nothing to keep off."""
    import torch

    torch.get_num_threads()  # ATen's lazy init of this thread's OpenMP count, which runs once per thread
    set_num_threads = _openmp_set_num_threads()
    if set_num_threads is None:
        log.debug("no OpenMP runtime loaded: nothing to keep off this thread")
        return
    set_num_threads(1)
    if torch.get_num_threads() != 1:  # another runtime took the call: this thread would start a second pool
        log.warning("omp_set_num_threads(1) did not reach torch's OpenMP runtime: this thread's count is %d",
                    torch.get_num_threads())


@functools.cache
def _openmp_set_num_threads():
    """`omp_set_num_threads` of the OpenMP runtime torch itself loaded (torch/lib/libgomp.so.1 here; libomp /
    libiomp5 elsewhere), or None without one. dlsym through libtorch_cpu's own handle searches that library's
    dependencies, so another package's copy (a wheel's bundled libgomp, the system's) mapped beside it, whatever
    its path sorts as, is never the one called; the memory map is the fallback where libtorch_cpu is not found.
    Looked up once per process: each `ctypes.CDLL` is a reference cycle (its own function-pointer class), so a
    lookup per thread left cyclic garbage whenever a thread pool started a thread (a mover thread started during
    tests/bench/test_bench_cache_steps.py's steps, on a loaded machine)."""
    import torch

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    if os.path.exists(torch_lib):
        try:
            return ctypes.CDLL(torch_lib).omp_set_num_threads
        except (OSError, AttributeError):  # a torch built without OpenMP
            return None
    runtime = _mapped_openmp_runtime()
    return None if runtime is None else runtime.omp_set_num_threads


def _mapped_openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime in this process's memory map (the kernel writes its paths with every symlink resolved),
    torch's own copy first, so that dlopen hands back the loaded copy, not another one."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if re.search(r"/lib(gomp|i?omp5?)[^/]*\.so", line)})
    except OSError:
        return None
    if not paths:
        return None
    import torch

    return ctypes.CDLL(pick_runtime(paths, os.path.realpath(os.path.dirname(torch.__file__))))


def pick_runtime(paths: list[str], torch_dir: str) -> str:
    """Of the mapped OpenMP runtimes' paths (sorted), torch's own copy (under `torch_dir`), else the first."""
    lib = torch_dir.rstrip(os.sep) + os.sep
    return min(sorted(paths), key=lambda path: not path.startswith(lib))
