"""Online estimates of how long an agent stays away between requests (tool time, thinking).

An exponentially weighted mean and mean absolute deviation per session and per tool name, learned
from request arrivals; SAM ranks waiting sessions by their predicted next arrival.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class GapEstimator:
    alpha: float = 0.3
    mean: float = 0.0
    dev: float = 0.0
    n: int = 0

    def observe(self, gap: float) -> None:
        gap = max(0.0, gap)
        if self.n == 0:
            self.mean, self.dev = gap, gap / 2
        else:
            self.dev += self.alpha * (abs(gap - self.mean) - self.dev)
            self.mean += self.alpha * (gap - self.mean)
        self.n += 1

    @property
    def known(self) -> bool:
        return self.n > 0

    def expected(self) -> float:
        return self.mean

    def stale_after(self) -> float:
        """A gap beyond this is unusual enough that the session has probably gone away."""
        return 3.0 * (self.mean + 2.0 * self.dev) + 1.0
