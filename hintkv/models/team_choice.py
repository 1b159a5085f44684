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

    chooser.use_team(rows) -> bool            which way this step runs
    chooser.record(rows, team, seconds)       its C++ call's wall time
"""

from __future__ import annotations

from collections import deque
from statistics import median


class TeamChooser:
    """The team or the regions for each eligible step, from their measured wall times (see the module docstring)."""

    def __init__(self, start_team: bool = False, probe_every: int = 32, probes: int = 5, window: int = 8,
                 margin: float = 0.85) -> None:
        if probe_every < 2 or probes < 1 or window < 1 or not 0 < margin <= 1:
            raise ValueError("probe_every >= 2, probes >= 1, window >= 1, 0 < margin <= 1")
        self.team = start_team  # the current choice
        self.probe_every, self.window, self.margin = probe_every, window, margin
        self.num_steps = 0
        self.num_switches = 0
        self._recent: dict[int, deque[float]] = {}  # rows -> the current choice's last wall times at that batch size
        self._ratios: deque[float] = deque(maxlen=probes)  # probe time / the current choice's median, same rows

    def use_team(self, rows: int) -> bool:
        self.num_steps += 1
        return self.team != (self.num_steps % self.probe_every == 0)

    def record(self, rows: int, team: bool, seconds: float) -> None:
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
