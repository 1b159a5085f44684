"""What a prefill chunk costs at its context, fitted from the engine's own steps (`srpt-cap`'s price).

    fit = ChunkCostFit(min_tokens=1024)
    fit.observe(sched, seconds)            # every step (`AdmissionPolicy.stepped`): only long chunks count
    fit.chunk_s(n, context)                # predicted seconds of an n-token chunk on a `context`-token prefix
    fit.largest(context, limit_s, lo, hi)  # the most tokens in [lo, hi] whose chunk costs <= limit_s

A chunk's cost is two terms: its tokens (the GEMMs, `a` a token) and their attention to the prefix
and to each other (`b` a query token per key token: n x (context + n / 2) pairs):

    chunk_s(n, c) = a * n + b * n * (c + n / 2)

On the h200-llama3-8b profile's cost model an 8192-token chunk on an empty context is 0.231 s (0.028
ms a token, its own attention included; the fit, with its pairs term, puts a at about 0.022 ms) and
the attention to a 100K prefix adds 0.198 ms a token: a long prompt's steps grow from 0.23 s to 2-3.5 s as its
context grows, and a call that arrives meanwhile waits for the whole step. The terms are fitted by
least squares over the steps that carry a chunk of at least `min_tokens` tokens (`srpt-cap`: 1/8 of
the step budget; the long prefills' chunks this prices: short calls' chunks are launch-bound and
would bend the fit), with old steps
forgotten at `DECAY` a step, so it follows the engine it runs on (the simulator's cost model, a
GPU, a CPU alike); until `MIN_SAMPLES` such steps are seen it predicts nothing (None).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hintkv.engine.outputs import SchedulerOutput

MIN_SAMPLES = 8  # samples before the fit predicts
DECAY = 0.995  # each older sample's weight, a sample (about the last 200 long-chunk steps count)


class ChunkCostFit:
    """Weighted least squares of a step's seconds on (tokens, attention pairs), no intercept."""

    __slots__ = ("min_tokens", "_xx", "_xy", "num_samples", "_coef", "_last")

    def __init__(self, min_tokens: int) -> None:
        self.min_tokens = min_tokens  # a step is a sample when its largest chunk has this many tokens
        self._xx = [0.0, 0.0, 0.0]  # sums of t*t, t*p, p*p (t: tokens, p: attention pairs)
        self._xy = [0.0, 0.0]  # sums of t*y, p*y
        self.num_samples = 0
        self._coef: tuple[float, float] | None = None
        # the last step seen without a sample: a decode stretch (sim.stretch) reports one
        # SchedulerOutput for each of its steps, and every row of it is a decode
        self._last: SchedulerOutput | None = None

    def observe(self, sched: SchedulerOutput, seconds: float) -> None:
        """A forward of `sched` took `seconds` (decode rows count as one token each)."""
        if seconds <= 0 or sched is self._last:
            return
        tokens = pairs = 0.0
        largest = 0
        for s in sched.scheduled:
            n, c = s.num_new_tokens, s.seq.num_computed_tokens
            tokens += n
            pairs += n * (c + n / 2)
            largest = max(largest, n)
        if largest < self.min_tokens:
            self._last = sched
            return
        t, p = tokens, pairs / 1e6  # pairs in millions: the normal equations stay well scaled
        xx, xy = self._xx, self._xy
        for i in range(3):
            xx[i] *= DECAY
        xy[0] *= DECAY
        xy[1] *= DECAY
        xx[0] += t * t
        xx[1] += t * p
        xx[2] += p * p
        xy[0] += t * seconds
        xy[1] += p * seconds
        self.num_samples += 1
        self._coef = None

    def coef(self) -> tuple[float, float] | None:
        """(a seconds a token, b seconds per attention pair), both >= 0; None until fitted."""
        if self.num_samples < MIN_SAMPLES:
            return None
        if self._coef is None:
            (tt, tp, pp), (ty, py) = self._xx, self._xy
            det = tt * pp - tp * tp
            if det <= 1e-12 * tt * pp:  # one context only: the pairs are not separable from the tokens
                a, b = ty / tt, 0.0
            else:
                a, b = (ty * pp - py * tp) / det, (tt * py - tp * ty) / det
                if a <= 0 or b < 0:  # a negative term fits noise: keep the tokens' term alone
                    a, b = ty / tt, 0.0
            self._coef = (a, b / 1e6)
        return self._coef

    def chunk_s(self, n: int, context: int) -> float | None:
        c = self.coef()
        if c is None:
            return None
        a, b = c
        return a * n + b * n * (context + n / 2)

    def largest(self, context: int, limit_s: float, lo: int, hi: int) -> int:
        """The most tokens m in [lo, hi] with chunk_s(m, context) <= limit_s (lo when none; hi
        when not fitted)."""
        c = self.coef()
        if c is None:
            return hi
        a, b = c
        if limit_s <= 0:
            return lo
        # (b / 2) m^2 + (a + b context) m - limit_s <= 0
        lin = a + b * context
        m = limit_s / lin if b == 0 else (-lin + math.sqrt(lin * lin + 2 * b * limit_s)) / b
        return max(lo, min(hi, int(m)))


SAMPLE_SHARE = 8  # a step is a cost sample when it carries a chunk of 1/8 of the budget or more


class FittedChunks:
    """Mixed into an admission policy (`srpt-cap`, `srpt-land`): `self.costs`, a `ChunkCostFit` made at
    the first step (a sample: a chunk of 1/`SAMPLE_SHARE` of the budget or more) and fed every step."""

    costs: ChunkCostFit | None = None

    def order_running(self, running, budget: int) -> None:
        super().order_running(running, budget)
        if self.costs is None:
            self.costs = ChunkCostFit(min_tokens=max(1, budget // SAMPLE_SHARE))

    def stepped(self, sched: SchedulerOutput, now: float) -> None:
        super().stepped(sched, now)
        if self.costs is not None:
            self.costs.observe(sched, now - sched.started)
