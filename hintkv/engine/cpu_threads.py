"""Binding the engine thread's OpenMP team to CPUs: vLLM's VLLM_CPU_OMP_THREADS_BIND, as `--cpu-omp-threads-bind`.

    check(spec)                      ValueError unless spec is auto | nobind | a list ("0-1,3") of allowed CPUs; torch-free
    resolve(spec, allowed) -> cpus   the CPUs to bind, one per OpenMP thread, or None (nobind)
    bind(cpus) -> tids               the calling thread's team: len(cpus) threads, thread i on cpus[i]
    engine_cpus(spec, device) -> cpus  resolve() on CPU devices, None elsewhere (AsyncLLM, at start)
    bind_engine_thread(cpus)         bind() first on the thread that runs the model's steps (AsyncLLM's loop)
    on_passing_thread(fn) -> fn()    fn run on a thread that ends with it, and its OpenMP pool with it (`serve` builds
                                     its engine there: with the tier threads kept off OpenMP, openmp_env's
                                     `serial_openmp_thread`, the engine thread's team is then the process's only one)

vLLM's CPU worker binds its OpenMP threads (0.32, read in /proc/PID of its worker: OMP_NUM_THREADS=2,
GOMP_CPU_AFFINITY="0 1", LD_PRELOAD of torch's libgomp; the wheel bundles no tcmalloc to preload;
older builds called init_cpu_threads_env, which pins each team thread in one parallel region). hintkv's model runs on the
engine thread, not the process's first thread, and libgomp keeps one pool of workers per thread that
starts parallel regions: so environment variables would pin the wrong thread (and every thread
created after it, which inherits its mask). `bind` pins the engine thread's own team, as
init_cpu_threads_env did (csrc/threads.cpp). Both servers load the same OpenMP runtime: torch's
libgomp (torch/lib/libgomp.so.1; hintkv's extensions resolve to it by soname); vLLM's venv ships
Intel's libiomp5 but does not load it, so KMP_BLOCKTIME / KMP_AFFINITY (its libiomp settings) apply to neither.

The same semantics as vLLM's variable: `auto` binds one logical CPU per physical core of those the
process may use (the last sibling, as vLLM's auto does on x86; hintkv has no separate front-end
process, so it reserves none), `nobind` leaves the threads to the OS, a list binds thread i to its
i-th CPU and sets the thread count to its length.

Default `nobind` (thirteenth session, dummy:tiny float32, 2 threads; docs/benchmarks/history/engine.md "Thirteenth
session, speed"): on free cores (SCHED_FIFO, bound vs unbound interleaved in one process) binding is neutral
(bound prefill at 0.91-1.10x unbound's speed at 512, 0.88-1.02x at 2048, signs flipping between runs); under
load a bound team waits for its own core while another process holds it, and its partner waits at the
barrier: `bench engine --variants bound` at load 9-14 read prefill 512 0.80x, 2048 0.55x, decode b1 0.35x,
cold TTFT 0.32x of the unbound server (vLLM, bound, collapsed the same way: decode b1 3-7 tok/s vs 13-35).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

CHOICES = ("auto", "nobind")  # or a CPU list
DEFAULT = "nobind"
_SYS_CPU = Path("/sys/devices/system/cpu")


def parse_cpu_list(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5] (Linux's cpulist syntax, order kept, no repeats)."""
    cpus: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or (dash and int(hi) < int(lo)):
            raise ValueError(f"cpu_omp_threads_bind: cannot read CPUs from {text!r} (auto, nobind, or a list "
                             "like '0-1,3')")
        for c in range(int(lo), int(hi if dash else lo) + 1):
            if c in cpus:
                raise ValueError(f"cpu_omp_threads_bind: CPU {c} named twice in {text!r}")
            cpus.append(c)
    return cpus


def check(spec: str) -> None:
    """ValueError unless `spec` is auto, nobind, or a list of CPUs this process may use (EngineConfig's
    check: `hintkv serve` then stops with a usage error before it loads the model)."""
    if spec not in CHOICES:
        resolve(spec)


def physical_cores(allowed: list[int], sys_cpu: Path = _SYS_CPU) -> list[int]:
    """One logical CPU per physical core among `allowed` (the highest-numbered sibling, as vLLM's auto),
    in core order; `allowed` itself where the topology cannot be read."""
    cores: dict[tuple[str, str], int] = {}
    try:
        for c in sorted(allowed):
            topo = sys_cpu / f"cpu{c}" / "topology"
            key = ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
            cores[key] = c  # sorted: the last sibling wins
    except OSError:
        return sorted(allowed)
    return sorted(cores.values())


def resolve(spec: str, allowed: list[int] | None = None) -> list[int] | None:
    """The CPUs `spec` binds (thread i on the i-th), None for nobind; a listed CPU this process may not
    use is a ValueError."""
    if spec == "nobind":
        return None
    allowed = sorted(os.sched_getaffinity(0)) if allowed is None else sorted(allowed)
    if spec == "auto":
        return physical_cores(allowed)
    cpus = parse_cpu_list(spec)
    outside = [c for c in cpus if c not in allowed]
    if outside:
        raise ValueError(f"cpu_omp_threads_bind: CPUs {outside} are not among this process's {allowed}")
    return cpus


def _ops():
    from hintkv.models import cpu_ext

    source = (Path(__file__).parent.parent / "models" / "csrc" / "threads.cpp").read_text()
    return cpu_ext.load("hintkv_threads", source, ["pin_threads"], ["-O2", "-fopenmp"])


def bind(cpus: list[int]) -> list[int]:
    """Make the calling thread's OpenMP team len(cpus) threads, thread i bound to cpus[i] (0: the caller);
    their Linux thread ids, or [] (warned) when the extension cannot be built."""
    import torch

    ops = _ops()
    if ops is None:
        warnings.warn("cpu_omp_threads_bind: no C++ extension to bind threads with; threads left unbound",
                      RuntimeWarning, stacklevel=2)
        return []
    torch.set_num_threads(len(cpus))
    return ops.pin_threads([[c] for c in cpus])


def engine_cpus(spec: str, device_type: str) -> list[int] | None:
    """The CPUs to bind the engine thread's team to (None: leave it); CPU devices only (vLLM's CPU worker).
    Resolved where the engine is built, so a bad list fails the server's start, not its engine thread."""
    cpus = resolve(spec) if device_type == "cpu" else None
    if cpus is not None:
        _ops()  # built here, before serving (a first build takes minutes), not on the engine thread
    return cpus


def bind_engine_thread(cpus: list[int] | None) -> list[int]:
    """Bind the calling (engine) thread's team to `cpus` (None: nothing); a failure is logged, not raised."""
    if cpus is None:
        return []
    try:
        tids = bind(cpus)
    except RuntimeError:  # sched_setaffinity refused (a CPU set changed since): serve unbound
        log.exception("cpu_omp_threads_bind: binding %s failed; threads left unbound", cpus)
        return []
    log.info("OpenMP threads of the engine bound: %s", ", ".join(f"tid {t} -> CPU {c}" for t, c in zip(tids, cpus)))
    return tids


def on_passing_thread(fn: Callable[[], T]) -> T:
    """fn() on a thread that exits when it returns (its exception raised here).

    libgomp keeps a pool of workers per thread that starts parallel regions, and while it manages more threads
    than CPUs it cuts every wait's spin to 100 (its throttled count), whatever GOMP_SPINCOUNT or OMP_WAIT_POLICY
    say. `serve` built its engine on the main thread, whose pool stayed beside the engine thread's (3 threads on
    2 CPUs): the spin openmp_env sets, or the user's, never reached the server (eighteenth session: the same
    voluntary context switches per request at GOMP_SPINCOUNT 100 and 100,000). A pool ends with its thread.

    The thread is a daemon and the caller only joins it: Ctrl-C during `serve`'s start leaves at once instead of
    waiting for the model's load, warm-up and a first kernel build (an executor's exit joined its thread)."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised on the caller's thread
            out["error"] = e

    thread = threading.Thread(target=run, name="hintkv-build", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]  # type: ignore[return-value]
