"""Keeping the engine's CPUs awake while a step runs (HINTKV_CPU_KEEPER=auto, the default; 1 always; 0 off).

    CpuKeeper.build(device_type, bound, gate) -> CpuKeeper | None   None: off (0), not a CPU engine, no extension,
                                                      or a keeper that could not take SCHED_IDLE / its CPU
    keeper.step()                                     a context manager around one forward: spin during it and
                                                      linger_s() after the last holder's (engines of a process
                                                      share); under auto, only while the engine's gate reads free
    linger_s()                                        HINTKV_CPU_KEEPER_LINGER_MS, else LINGER_S (2 ms)
    with keepers_off(): LLMEngine(...)                an engine without keepers (measured in process CPU time)

Why (twenty-first session, prefill7): this machine is a VM whose idle vCPU halts at once (the kernel's
cpuidle-haltpoll with guest_halt_poll_ns=0: no polling), so waking a thread on a halted vCPU waits for the host
to run that vCPU again. The engine's OpenMP worker sleeps between parallel regions (GOMP_SPINCOUNT=100,
openmp_env.py: ~10 us of spin here), and a 512-token prefill step starts ~110 regions, a b8 decode step ~40: on a
quiet box each start may wake a halted vCPU. Under load the vCPUs never halt (halts counted in
/sys/devices/system/cpu/cpu*/cpuidle/state1/usage: 0 per 512 step at load 6), and there plain hintkv shows no slow
mode; on the quiet box of the twenty-first session's opening run its 512 prefill and b8 decode ran 1.5-1.7x slower
in two rounds of three. A longer OpenMP spin keeps the worker awake but takes the CPU from every other process
under load (GOMP_SPINCOUNT=100,000 read prefill 512 2.4x slower at load 7-10, openmp_env.py); a keeper thread at
SCHED_IDLE spins instead, on each of the engine's CPUs, only while a step runs: a thread that wakes (the worker too)
preempts it at once, and a thread of its own scheduling group that stays runnable cedes it only SCHED_IDLE's weight
(3 against 1024: ~0.3% of a busy CPU, in slices of ~3 ms). Only of its own group: under autogroup
(/proc/sys/kernel/sched_autogroup_enabled, every session its own group, as `bench engine` and a shell start a server)
a spinning keeper takes a full group's share from every other session on its CPU, charged to the server's group
(measured, twenty-fourth session: a SCHED_IDLE and a normal spinner on one CPU took 0.15 / 2.38 s of CPU in one session,
2.06 / 2.06 s in two; docs/benchmarks/history/engine.md, the twenty-fourth session's cold section). Served under load
6-22 its 512 TTFT read 1.65x plain's twice (prefill7's section; the keepers always on then: autogroup is a plausible
cause), where nothing halts and a keeper cannot help; on the quiet box of the lead's closing run (`bench engine --variants keeper`) it took the 512 prefill 1.33x and the cold TTFT 1.46x
faster. So `auto` does not hold the keepers while the engine's contention gate reads contended
(models/team_choice.ContentionGate over the engine thread's RunqueueWait, with hysteresis; the one gate the engine
owns and ticks once a step, which the decode team's chooser reads too). auto has been measured on quiet boxes only
(the lead's closing runs, load 0.7-1.7), not yet under the load where prefill7 saw the 1.65x loss (review_lead22
finding 7); the gate's first reading comes one check period after the engine's first step.

The linger (twenty-sixth session, pf): vLLM never lets its CPUs idle around a request (its OpenMP threads spin
libgomp's 300,000, its worker polls 1 s after a request), and the bench's cold sample comes ~3-8 ms after the cached
one's response, past a 2 ms linger, so its first step may start on halted vCPUs. `HINTKV_CPU_KEEPER_LINGER_MS`
(`bench engine --variants linger`: 1000, vLLM's poll) keeps them spinning longer. A lingering keeper spins only on a
CPU nothing else wants: when any other thread took 30% of a 5 ms window from it, it sleeps until the next step
(csrc/keeper.cpp), so a loaded box loses at most a window or two per step's end, whatever the linger.

The keepers are started once per process (csrc/keeper.cpp): one per OpenMP thread of the engine, pinned one per CPU
when the engine's CPUs are known (bound, or a process allowed exactly that many CPUs), else left to the OS.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from hintkv.models.team_choice import ContentionGate

log = logging.getLogger(__name__)

started = False  # this process's keeper set is running (one set a process: csrc/keeper.cpp)
LINGER_S = 0.002  # spin this long after a step: the gap to the next step of a running batch (its schedule, update)


def linger_s() -> float:
    """HINTKV_CPU_KEEPER_LINGER_MS: how long the keepers spin after the last step (ms; unset: LINGER_S). A lingering
    keeper yields its CPU for good once anything else runs there (csrc/keeper.cpp), so only idle CPUs spin."""
    text = os.environ.get("HINTKV_CPU_KEEPER_LINGER_MS", "").strip()
    if not text:
        return LINGER_S
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= 10_000:
        raise ValueError(f"HINTKV_CPU_KEEPER_LINGER_MS must be a number of ms in 0-10000, not {text!r}")
    return ms / 1000


def _ops():
    from hintkv.models import cpu_ext

    source = (Path(__file__).parent.parent / "models" / "csrc" / "keeper.cpp").read_text()
    return cpu_ext.load("hintkv_keeper", source, ["keeper_start", "keeper_enter", "keeper_leave", "keeper_stats"],
                        ["-O2"])


def wanted() -> str:
    """HINTKV_CPU_KEEPER: "1" always, "0" off, "auto" (or unset, the default) gated by contention; else refused."""
    value = os.environ.get("HINTKV_CPU_KEEPER", "").strip() or "auto"
    if value not in ("0", "1", "auto"):
        raise ValueError(f"HINTKV_CPU_KEEPER must be 0, 1 or auto, not {value!r}")
    return value


@contextlib.contextmanager
def keepers_off() -> Iterator[None]:
    """Engines built inside start no keepers (HINTKV_CPU_KEEPER=0 while they are built): for in-process measurements
    in process CPU time, where the keepers' spin would count as the engine's (review_lead22 finding 2: 1.15x the engine
    thread's own time with keepers always on)."""
    old = os.environ.get("HINTKV_CPU_KEEPER")
    os.environ["HINTKV_CPU_KEEPER"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HINTKV_CPU_KEEPER", None)
        else:
            os.environ["HINTKV_CPU_KEEPER"] = old


def keeper_cpus(threads: int, bound: list[int] | None = None) -> list[int]:
    """One entry per keeper: the engine's bound CPUs, else the process's CPUs when it may use exactly `threads`
    of them, else -1 each (the OS places them)."""
    if bound:
        return list(bound)
    allowed = sorted(os.sched_getaffinity(0))
    return allowed if len(allowed) == threads else [-1] * threads


class CpuKeeper:
    """Spins SCHED_IDLE threads on the engine's CPUs during each step (see the module docstring)."""

    def __init__(self, ops, cpus: list[int], policy: int = os.SCHED_IDLE, gate: ContentionGate | None = None) -> None:
        self._ops = ops
        self.cpus = cpus
        self.gate = gate  # auto: the engine's gate (it ticks it), no hold while contended; None: every step holds
        self.num_gated = 0  # steps run without the keepers for contention
        self.linger_ns = int(linger_s() * 1e9)
        self.tids = ops.keeper_start(cpus, policy)  # raises when a keeper could not take the policy or its CPU
        global started
        started = True

    @classmethod
    def build(cls, device_type: str, bound: list[int] | None = None,
              gate: ContentionGate | None = None) -> CpuKeeper | None:
        """The keepers for an engine on `device_type`; under auto gated by `gate` (the engine's, which it ticks)."""
        mode = wanted()
        if mode == "0" or device_type != "cpu":
            return None
        ops = _ops()
        if ops is None:
            log.warning("HINTKV_CPU_KEEPER=%s: no C++ extension to build the keepers with; running without them", mode)
            return None
        import torch

        if mode == "auto" and gate is None:
            raise ValueError("HINTKV_CPU_KEEPER=auto needs the engine's contention gate")
        try:
            keeper = cls(ops, keeper_cpus(torch.get_num_threads(), bound), gate=gate if mode == "auto" else None)
        except RuntimeError as e:  # its threads exited without spinning: never spin at a normal priority
            log.warning("HINTKV_CPU_KEEPER=%s: no keepers (%s); running without them", mode, e)
            return None
        log.info("CPU keepers (SCHED_IDLE) started: tids %s on CPUs %s", keeper.tids, keeper.cpus)
        return keeper

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        if self.gate is not None:
            if self.gate.contended:  # nothing halts under load: the keepers would only take CPU
                self.num_gated += 1
                yield
                return
        self._ops.keeper_enter()
        try:
            yield
        finally:
            self._ops.keeper_leave(self.linger_ns)

    def stats(self) -> tuple[int, int, int, int]:
        """(spin rounds of 64 pauses, futex sleeps, steps holding them now, lingers cut short because another
        thread ran on the keeper's CPU) of every keeper so far."""
        spins, sleeps, holders, yields = self._ops.keeper_stats()
        return spins, sleeps, holders, yields
