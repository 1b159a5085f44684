"""Online estimates of how long an agent stays away between requests (tool time, thinking).

An exponentially weighted mean and mean absolute deviation per session and per tool name, learned
from request arrivals (`sam` ranks waiting sessions by the predicted next arrival), and the last
`WINDOW` gaps themselves: agents' gaps are heavy-tailed (most tool calls return in seconds, a few
take minutes), so `sam-dist` asks the distribution, not the mean: given that a session has been
away `t` seconds, how much longer (`residual(t)`: the median of the observed gaps longer than `t`,
minus `t`). A long wait makes a long remaining wait likely, which no mean can say.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

WINDOW = 64  # gaps kept per estimator: enough for a median of a tail, bounded memory


@dataclass(slots=True)
class GapEstimator:
    alpha: float = 0.3
    mean: float = 0.0
    dev: float = 0.0
    n: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    # (expected(), stale_after()) as of the last observation: read on every class computation
    prediction: tuple[float, float] = (0.0, 1.0)

    def observe(self, gap: float) -> None:
        gap = max(0.0, gap)
        if self.n == 0:
            self.mean, self.dev = gap, gap / 2
        else:
            self.dev += self.alpha * (abs(gap - self.mean) - self.dev)
            self.mean += self.alpha * (gap - self.mean)
        self.n += 1
        self.recent.append(gap)
        self.prediction = (self.expected(), self.stale_after())

    @property
    def known(self) -> bool:
        return self.n > 0

    def expected(self) -> float:
        return self.mean

    def stale_after(self) -> float:
        """A gap beyond this is unusual enough that the session has probably gone away."""
        return 3.0 * (self.mean + 2.0 * self.dev) + 1.0

    def residual(self, elapsed: float) -> float:
        """Predicted seconds still to wait, given `elapsed` seconds away already: the median of
        the remaining parts of the observed gaps longer than `elapsed`; beyond every observed gap,
        `elapsed` itself (a heavy tail's residual grows with the wait: Pareto with shape 2)."""
        longer = [g - elapsed for g in self.recent if g > elapsed]
        if longer:
            return median(longer)
        return max(elapsed, 0.0)
