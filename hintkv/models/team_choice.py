"""Which way a decode step runs its threads, chosen from measured step times (HINTKV_DECODE_TEAM=auto).

The one-region team (csrc/decode_team.cpp) beats a region per kernel (csrc/decode_layers.cpp) on free cores and
loses to it under a shared machine's load (eighteenth session, served dummy:tiny b8: 1.20x on free cores, 0.50-0.66x
at load 9-12; 0.91x and 1.18x at load 5-7). Which one wins depends on what else runs on the CPUs, and that changes
while a server runs, so `TeamChooser` measures: each step runs the current choice, every `probe_every`-th eligible
step runs the other one, and a probe's wall time is compared with the current choice's recent steps of the same
batch size (the same work: a decode batch's steps differ by a token of context). Once the median of the last
`probes` such ratios is below `margin`, the other way is faster and becomes the choice. Both give the same bits, so
the choice changes speed only.

The margin: a switch clears both ways' evidence, and a wrong one holds the slower way for at least probes x
probe_every steps. With no margin (switch below 1.0) and 3 probes, a 1.2x gap under per-step noise U(0.7, 1.4) (a
loaded machine's) flipped 21 times in 5,000 steps and spent 24% of them on the slower way (review_decode2b, the real
chooser in simulation, 8 seeds); margin 0.85 over 5 probes: 1.8 switches, 8.3% (the probes alone are 3%). A smaller
gap is then left alone (a 1.1x gap at that noise: 18% on the slower way, against 38%).

Contention first (twenty-first session): the team loses under load because every phase's end needs both threads on
a CPU at once, and that is visible directly: the engine thread's share of time spent runnable but waiting for a CPU
(`RunqueueWait`, /proc/thread-self/schedstat, read every `check_every` steps: ~3 us). Above `busy_share` the steps
run the regions (no probes, no evidence kept) until it drops below `free_share`; below it the timing rule above runs,
starting from the team (`DecodeLayers` starts auto there). Measured served (dummy:tiny, b8, 2 threads): the engine
thread waited 0.6-0.8 of its run time at load 4-9; under SCHED_FIFO, none.

    chooser.use_team(rows) -> bool            which way this step runs
    chooser.record(rows, team, seconds)       its C++ call's wall time
    RunqueueWait()() -> share | None          the calling thread's wait / (run + wait) since the last call
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from statistics import median


class RunqueueWait:
    """The share of the calling thread's time since the last call spent runnable but not running (waiting for a CPU),
    from /proc/thread-self/schedstat (run ns, wait ns); None on the first call, where the file is missing (not
    Linux, no schedstats) or nothing ran. The file is the calling thread's (the engine thread, which runs the steps,
    not the one that built the model): a call from another thread (a second engine sharing the model, a harness
    stepping from a new thread) reopens it for that thread and starts over, so a thread that exited never leaves
    the reading missing for good."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._thread: int | None = None  # threading.get_ident() of the thread whose file _fd is
        self._last: tuple[int, int] | None = None
        self._missing = False

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)

    def __call__(self) -> float | None:
        if self._missing:
            return None
        if self._thread != threading.get_ident() and self._fd is not None:  # another thread's file: start over
            os.close(self._fd)
            self._fd, self._last = None, None
        try:
            if self._fd is None:
                self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
                self._thread = threading.get_ident()
            run, wait = (int(x) for x in os.pread(self._fd, 128, 0).split()[:2])
        except (OSError, ValueError):
            self._missing = True
            return None
        last, self._last = self._last, (run, wait)
        if last is None or run + wait <= sum(last):
            return None
        return (wait - last[1]) / (run + wait - sum(last))


class ContentionGate:
    """Contended or not, from a share reader (`RunqueueWait`) read every `check_every`-th `tick()`: over `busy_share`
    contended, until a reading under `free_share` (hysteresis). A missing reading (None) changes nothing. Shared by
    the decode team's chooser and the CPU keepers (engine/cpu_keeper.py): both help on free cores only."""

    def __init__(self, contention: Callable[[], float | None], check_every: int = 16, busy_share: float = 0.25,
                 free_share: float = 0.10) -> None:
        if check_every < 1 or not 0 <= free_share <= busy_share:
            raise ValueError("check_every >= 1, 0 <= free_share <= busy_share")
        self.contention, self.check_every = contention, check_every
        self.busy_share, self.free_share = busy_share, free_share
        self.contended = False
        self.num_ticks = 0

    def tick(self) -> bool:
        """Count a step; True when this step's reading flipped `contended`."""
        self.num_ticks += 1
        if self.num_ticks % self.check_every:
            return False
        share = self.contention()
        if share is None or self.contended == (share > (self.free_share if self.contended else self.busy_share)):
            return False
        self.contended = not self.contended
        return True


class TeamChooser:
    """The team or the regions for each eligible step, from their measured wall times (see the module docstring)."""

    def __init__(self, start_team: bool = False, probe_every: int = 32, probes: int = 5, window: int = 8,
                 margin: float = 0.85, contention: Callable[[], float | None] | None = None, check_every: int = 16,
                 busy_share: float = 0.25, free_share: float = 0.10) -> None:
        if probe_every < 2 or probes < 1 or window < 1 or not 0 < margin <= 1:
            raise ValueError("probe_every >= 2, probes >= 1, window >= 1, 0 < margin <= 1")
        self.team = start_team  # the current choice while the CPUs are not contended
        self.gate = ContentionGate(contention or (lambda: None), check_every, busy_share, free_share)
        self.num_contended = 0  # steps run in the regions for contention
        self.probe_every, self.window, self.margin = probe_every, window, margin
        self.num_steps = 0
        self.num_switches = 0
        self._recent: dict[int, deque[float]] = {}  # rows -> the current choice's last wall times at that batch size
        self._ratios: deque[float] = deque(maxlen=probes)  # probe time / the current choice's median, same rows

    def use_team(self, rows: int) -> bool:
        self.num_steps += 1
        if self.gate.tick():  # the last contention reading was over busy_share (until one under free_share)
            self._recent.clear()  # times from before the change: not a yardstick for after it
            self._ratios.clear()
        if self.contended:
            self.num_contended += 1
            return False
        return self.team != (self.num_steps % self.probe_every == 0)

    @property
    def contended(self) -> bool:
        return self.gate.contended

    def record(self, rows: int, team: bool, seconds: float) -> None:
        if self.contended:  # the regions by contention, not a probe: no evidence either way
            return
        recent = self._recent.setdefault(rows, deque(maxlen=self.window))
        if team == self.team:
            recent.append(seconds)
            return
        if len(recent) < 2:  # nothing to compare the probe with yet
            return
        self._ratios.append(seconds / median(recent))
        if len(self._ratios) == self._ratios.maxlen and median(self._ratios) < self.margin:
            self.team = team
            self.num_switches += 1
            self._recent.clear()  # the old choice's times: now the probes' yardstick is the new choice's
            self._ratios.clear()
