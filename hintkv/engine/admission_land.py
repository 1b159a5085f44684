"""`srpt-land`: `srpt-drain` whose chunk that does not finish its prompt ends by the expected landing
of a load in flight, so the call that waits for that load computes in the next step (issue #9).

A call whose prefix a lower tier holds is admitted LOADING and computes in the first step after its
load landed (`engine.load_timing`, next-step). A host load of a ~93K-token prefix takes about 0.2 s
on the h200-llama3-8b profile, but the step in flight when it lands may be a long prompt's
8192-token chunk at a 100-200K context (2-3.5 s): the call waits for the rest of that step. On the
whole trace set at 10 users (docs/benchmarks/history/sim.md, twenty-third session, room6) the load
wait is 0.0052 s a call under `srpt-drain`, about half of it that step.

Here, while a load is in flight (`Scheduler.next_landing`: its start plus its blocks at the tier's
estimated load time, `TierLoads.next_landing_s`), a chunk that does not finish its prompt is cut so
that it costs no more than the time left until then (priced at its context by `ChunkCostFit`, the
tokens already in the step at the fit's cost a token), never below 1/`FLOOR_SHARE` of the budget.
A finishing chunk is never cut (its first token would come later). The long prompt pays the cut
chunk's own cost only (at a long context attention costs the same a token in smaller chunks:
`engine.admission_cap`). Engine knowledge, no hints: `lru+host/srpt-land` has it too. Until the fit
has its samples nothing is cut (a fresh engine runs `srpt-drain`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hintkv.engine.admission import register_admission
from hintkv.engine.admission_srpt import SrptDrainAdmission
from hintkv.engine.chunk_costs import FittedChunks

FLOOR_SHARE = 8  # a cut chunk keeps at least 1/8 of the budget (1024 of 8192)


@register_admission("srpt-land")
class SrptLandAdmission(FittedChunks, SrptDrainAdmission):
    """`srpt-drain`; an unfinished chunk ends by the expected landing of a load in flight."""

    landings: Callable[[], float] = staticmethod(lambda: math.inf)  # until a scheduler attaches its own

    def attach_landings(self, landings: Callable[[], float]) -> None:
        self.landings = landings

    def chunk(self, todo: int, n: int, used: int = 0, done: int = 0) -> int:
        """A query (the `AdmissionPolicy.chunk` contract): `used`, the step's tokens so far, are
        priced at the fit's cost a token."""
        n = super().chunk(todo, n, used, done)
        floor = max(1, self._budget // FLOOR_SHARE)
        if todo <= n or n <= floor or self.costs is None or (coef := self.costs.coef()) is None:
            return n
        left = self.landings()
        if left == math.inf:
            return n
        return self.costs.largest(done, left - coef[0] * used, floor, n)
