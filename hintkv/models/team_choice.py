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
(`RunqueueWait`, /proc/thread-self/schedstat: ~3 us a reading). `ContentionGate` turns those readings into one
contended / free state with hysteresis; the engine owns the one gate of its thread and ticks it once a step
(engine/llm_engine.py), the decode team's chooser and the CPU keepers (engine/cpu_keeper.py) read it. While it reads
contended the steps run the regions (no probes, no evidence kept; a model stepped without an engine has no gate and
never reads contended); once free again the timing rule above runs,
starting from the team (`DecodeLayers` starts auto there). Measured served (dummy:tiny, b8, 2 threads): the engine
thread waited 0.48-0.8 of its run + wait time at load 4-9; under SCHED_FIFO, none.

    gate.tick() -> bool                       the engine, once a step: True when this step's reading flipped it
    gate.contended                            the state both users read
    chooser.use_team(rows, contended) -> bool which way this step runs
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
    from /proc/thread-self/schedstat (run ns, wait ns); None on a thread's first call, where the file is missing (not
    Linux, no schedstats) or nothing ran. The file is the calling thread's, keyed by its kernel tid
    (`threading.get_native_id()`: `get_ident()` is the pthread_t, which glibc hands to the next thread, so a new
    thread read a dead one's file; review_lead22 finding 1): a call from another thread (a second engine sharing the
    model, a harness stepping from a new thread) reopens it for that thread and starts over, and a read that fails on
    an open file reopens once, so only a file that cannot be opened leaves the reading missing for good."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._tid: int | None = None  # the kernel tid of the thread whose file _fd is
        self._last: tuple[int, int] | None = None
        self._missing = False

    def __del__(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._last = None, None

    def _read(self) -> tuple[int, int]:
        if self._fd is None:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            self._tid = threading.get_native_id()
        run, wait = (int(x) for x in os.pread(self._fd, 128, 0).split()[:2])
        return run, wait

    def __call__(self) -> float | None:
        if self._missing:
            return None
        if self._tid != threading.get_native_id():  # another thread's file (or none yet): start over
            self._close()
        try:
            try:
                run, wait = self._read()
            except (OSError, ValueError):
                if self._fd is None:  # the open itself failed: no schedstat here
                    raise
                self._close()  # a file gone stale under the same tid: reopen once
                run, wait = self._read()
        except (OSError, ValueError):
            self._close()
            self._missing = True
            return None
        last, self._last = self._last, (run, wait)
        if last is None or run + wait <= sum(last):
            return None
        return (wait - last[1]) / (run + wait - sum(last))


class ContentionGate:
    """Contended or not, from a share reader (`RunqueueWait`) read at the first `tick()` (its baseline) and every
    `check_every`-th after: over `busy_share` contended, until a reading at or under `free_share` (hysteresis). A missing
    reading (None) changes nothing. Its settings live here only: the engine builds the one gate of its thread
    (`for_engine_thread`) and hands it to the decode team's chooser (through the model) and to the CPU keepers; both
    help on free cores only."""

    CHECK_EVERY = 16
    BUSY_SHARE = 0.25
    FREE_SHARE = 0.10

    def __init__(self, contention: Callable[[], float | None], check_every: int = CHECK_EVERY,
                 busy_share: float = BUSY_SHARE, free_share: float = FREE_SHARE) -> None:
        if check_every < 1 or not 0 <= free_share <= busy_share:
            raise ValueError("check_every >= 1, 0 <= free_share <= busy_share")
        self.contention, self.check_every = contention, check_every
        self.busy_share, self.free_share = busy_share, free_share
        self.contended = False
        self.num_ticks = 0

    @classmethod
    def for_engine_thread(cls) -> ContentionGate:
        """The gate an engine ticks on its own thread: the engine thread's runqueue wait, at the settings above."""
        return cls(RunqueueWait())

    def tick(self) -> bool:
        """Count a step; True when this step's reading flipped `contended`."""
        self.num_ticks += 1
        if self.num_ticks == 1 and self.check_every > 1:  # the reader's baseline: the first share comes a period on
            self.contention()
            return False
        if self.num_ticks % self.check_every:
            return False
        share = self.contention()
        if share is None or self.contended == (share > (self.free_share if self.contended else self.busy_share)):
            return False
        self.contended = not self.contended
        return True


class TeamChooser:
    """The team or the regions for each eligible step, from their measured wall times (see the module docstring); the
    contention state comes in with each step (`use_team(rows, contended)`: the engine's `ContentionGate`)."""

    def __init__(self, start_team: bool = False, probe_every: int = 32, probes: int = 5, window: int = 8,
                 margin: float = 0.85) -> None:
        if probe_every < 2 or probes < 1 or window < 1 or not 0 < margin <= 1:
            raise ValueError("probe_every >= 2, probes >= 1, window >= 1, 0 < margin <= 1")
        self.team = start_team  # the current choice while the CPUs are not contended
        self.contended = False  # as the last step was told
        self.num_contended = 0  # steps run in the regions for contention
        self.probe_every, self.window, self.margin = probe_every, window, margin
        self.num_steps = 0
        self.num_switches = 0
        self._recent: dict[int, deque[float]] = {}  # rows -> the current choice's last wall times at that batch size
        self._ratios: deque[float] = deque(maxlen=probes)  # probe time / the current choice's median, same rows

    def use_team(self, rows: int, contended: bool = False) -> bool:
        self.num_steps += 1
        if contended != self.contended:  # over busy_share (until under free_share) or back
            self.contended = contended
            self._recent.clear()  # times from before the change: not a yardstick for after it
            self._ratios.clear()
        if contended:
            self.num_contended += 1
            return False
        return self.team != (self.num_steps % self.probe_every == 0)

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
