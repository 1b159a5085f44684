"""`srpt-cap`: `srpt-drain` whose steps that carry an unfinished prefill's chunk are capped in time,
priced by the engine's own step costs (issue #9: the step in flight is what a short call waits for).

A call that arrives while a step runs waits for that step. On the whole trace set at 10 users
(h200-llama3-8b, full scale; docs/benchmarks/history/sim.md, twenty-second session, room5) that
wait is 0.0165 s a call under `srpt-drain`, and 0.0107 of it is behind long prompts' 8192-token
chunks at 32K+ tokens of context: such a chunk is 0.78 s at 32K, 1.86 s at 100K, 3.5 s at 200K
(the attention to the prefix, not the tokens, is what grows). The chunk's size hardly matters to
the long prompt itself: at 100K+ of context attention costs the same a token at 2048 tokens as at
8192, so a 100K-token prefill from a 150K prefix costs +0.6% in 2048-token chunks, +0.4% in 4096.

So here a chunk that does not finish its prompt is cut so that it costs at most `STEP_BUDGETS`
times a budget-sized chunk on an empty context (both priced by the fit, so the limit and the cuts
follow the samples it has seen: fitted on one 200K-token prompt's 8192-token steps on that profile,
a = 0.0219 ms a token and the limit 3 x 0.245 s = 0.736 s, which cuts a chunk at a 32K context to
7,830 tokens, at 100K to 3,320, at 150K to 2,307, each 1-2% over the limit: the fit has no
intercept; review_sim22 finding 5), never below
1/`FLOOR_SHARE` of the budget; and while the step already carries prefill chunks, another chunk
that does not finish waits (`holds`, unless due) when they would cost more than that together:
cutting the chunk alone only let a second long prefill take the freed budget into the same step
(the step stayed long; on the 10-task slice the others' share of the step grew from 0.016 to 0.047
s a call and the mean TTFT moved +0.0%/-0.2%, where with the hold it is -1.1%). The price is
`engine.chunk_costs.ChunkCostFit`, fitted from the steps this policy sees (`FittedChunks`): until it has
its samples nothing is cut, so a fresh engine runs `srpt-drain`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hintkv.engine.admission import register_admission
from hintkv.engine.admission_alone import finishes
from hintkv.engine.admission_srpt import SrptDrainAdmission
from hintkv.engine.chunk_costs import FittedChunks

if TYPE_CHECKING:
    from hintkv.engine.outputs import SchedulerOutput
    from hintkv.engine.sequence import Sequence

STEP_BUDGETS = 3.0  # a step with an unfinished prefill's chunk costs at most this many empty-context budgets
FLOOR_SHARE = 4  # a cut chunk keeps at least 1/4 of the budget (2048 of 8192: attention a token is flat there)


@register_admission("srpt-cap")
class SrptCapAdmission(FittedChunks, SrptDrainAdmission):
    """`srpt-drain`; an unfinished prefill's chunk and the step it joins cost at most `limit_s`."""

    def limit_s(self) -> float | None:
        """The cap on a step with an unfinished prefill's chunk (None: not fitted yet)."""
        one = None if self.costs is None else self.costs.chunk_s(self._budget, 0)
        return None if one is None else STEP_BUDGETS * one

    def chunk(self, todo: int, n: int, used: int = 0, done: int = 0) -> int:
        n = super().chunk(todo, n, used, done)
        floor = max(1, self._budget // FLOOR_SHARE)
        limit = self.limit_s()
        if todo <= n or n <= floor or limit is None:
            return n  # a finishing chunk is never cut (its first token would come later)
        return self.costs.largest(done, limit, floor, n)

    def holds(self, seq: Sequence, n: int, out: SchedulerOutput, done: int) -> bool:
        if super().holds(seq, n, out, done):
            return True
        if n <= 1 or finishes(seq, n, done):
            return False
        limit = self.limit_s()
        if limit is None:
            return False
        cost = self.costs.chunk_s(n, done)
        for s in out.scheduled:
            if s.num_new_tokens > 1 and s.seq is not seq:  # the step's other prefill chunks (a decode is one
                # token; a capped prefill's top-up asks with its own first part already in the step)
                cost += self.costs.chunk_s(s.num_new_tokens, s.seq.num_computed_tokens)
                if cost > limit:
                    return not self._aged(seq, seq.num_tokens - done, self._budget)
        return False
