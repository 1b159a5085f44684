"""`srpt-resume`: `srpt-drain` whose prefill chunks end about when SAM predicts the next call of a
session that is away on its tool (a hint-derived lever, issue #9).

A call that arrives during a step waits for the whole step: behind a long prompt's 8192-token chunk
at a 100-200K-token context that is up to 2-3.5 s on the h200-llama3-8b profile, and on the whole
trace set the wait for the step in flight is the largest part of the queue (0.0157 s a call under
srpt-drain). With hints, SAM knows each session's last end and its predicted gap (its own history,
else its tool's: `SessionRegistry.predicted_gap`), so it knows when the next call is likely
(`SessionAwareManager.next_return`). Here a prefill chunk that does not finish its prompt is cut so
that the step's tokens (all of them, decodes included, at the engine's measured cost a token,
`prefill_s_per_token`: an average over its steps, not the cost at the chunk's own context) end by
that time, down to 1/`MIN_SHARE` of the step budget: the returning call then starts in the next
step instead of waiting for the long chunk. The cut costs the long prefill: no per-step overhead on
the h200 profiles, but a short chunk at a long context costs more a token (at 100K cached on
h200-llama3-8b, 0.227 ms a token in 8192-token chunks, 0.574 at the 256-token floor; the floors
128/256/512 measured the same on the 10-task slice). A finishing chunk is never cut (its first
token would come later). It needs hints and a tier stack (which keeps the cost a token): without a
lower tier nothing is cut.

Without hints no session is known (`SessionAwareManager.next_return` has nothing): the policy is
`srpt-drain` on the lru rows, so `lru+host/srpt-resume` is the same scheduler unhinted.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hintkv.engine.admission import register_admission
from hintkv.engine.admission_srpt import SrptDrainAdmission
from hintkv.engine.sequence import Sequence

MIN_SHARE = 32  # a cut chunk computes at least 1/32 of the step budget (256 of 8192 tokens; the
# 10-task slice measured 128, 256 and 512 the same)


@register_admission("srpt-resume")
class SrptResumeAdmission(SrptDrainAdmission):
    """`srpt-drain`; a chunk that does not finish its prompt ends by SAM's next predicted return."""

    def __init__(self, max_skips: int = 16, max_scan: int = 64, max_model_len: int | None = None) -> None:
        super().__init__(max_skips, max_scan, max_model_len)
        # () -> (seconds until the next predicted return, prefill seconds a token): from a hinted
        # scheduler with SAM (`attach_returns`), else None: nothing is cut
        self.returns: Callable[[], tuple[float, float]] | None = None
        self._left_s = math.inf  # seconds from this step's start until the predicted return
        self._token_s = 0.0

    def attach_returns(self, returns: Callable[[], tuple[float, float]]) -> bool:
        self.returns = returns
        return True

    def order_running(self, running: list[Sequence], budget: int) -> None:
        super().order_running(running, budget)
        self._left_s = math.inf
        if self.returns is not None:
            self._left_s, self._token_s = self.returns()

    def chunk(self, todo: int, n: int, used: int = 0, done: int = 0) -> int:
        """A query (the `AdmissionPolicy.chunk` contract): the step's `used` tokens (decodes,
        finishing chunks and chunks asked for earlier in the step that did run) are what is
        already spent of the time until the predicted return; a chunk asked for and not run
        (refused for room, held) costs nothing."""
        n = super().chunk(todo, n, used, done)
        least = max(1, self._budget // MIN_SHARE)
        if n <= least or todo <= n or self._left_s == math.inf or self._token_s <= 0:
            return n
        return min(n, max(least, int(self._left_s / self._token_s) - used))
