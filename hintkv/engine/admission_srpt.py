"""`srpt` and `srpt-alone`: `short-first` whose deadlines age `AGING` (4) times slower, nearer
shortest-remaining-prefill-first (opt-in: `--scheduling-policy srpt`).

`short-first` keys a prefill by a deadline in steps, `first seen + tokens to compute / budget`:
a long prompt that arrived a few steps before a short one overtakes it once its deadline passes,
so with 100K-300K-token prompts on one instance the short calls that arrive during a long prefill
wait behind the part of it that aged past them. Shortest remaining work first gives the least mean
flow time on one server (Schrage 1968; `sim.contended` bounds the mean TTFT with it), but starves a
long prompt under a stream of short ones. Here the deadline is `first seen + AGING x tokens to
compute / budget`: a long prefill is overtaken only by work that arrives before its later
deadline, so it waits at most about AGING times its own steps (tested); the order among the ones
that arrive together is `short-first`'s (remaining tokens), and the room rule, the running
prefills' yield and the decodes first are `short-first`'s.

`srpt-alone` adds `short-alone`'s rule (`engine.admission_alone.FinishersAlone`): a step that gives
a prefill its first token carries no chunk of one that does not finish (unless it is due, here at
the later deadline), and a prefill with more left than the budget computes at most half of it.

Engine-only knowledge (no hints): `hintkv sim --scheduling-policy srpt` runs it on the hinted rows,
and `lru+host/srpt` on the lru one. Measured on the sim's full-scale slices (h200-llama3-8b, 10
users, block 64; docs/benchmarks/history/sim.md, fifteenth session, sched): 10 tasks, sam+hints+host mean TTFT
short-first 1.688 s, srpt 1.592, srpt-alone 1.584 (aging 16: 1.592 / 1.582, so 4 is past the knee).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hintkv.engine.admission import ShortFirstAdmission, register_admission
from hintkv.engine.admission_alone import FinishersAlone

if TYPE_CHECKING:
    from hintkv.engine.sequence import Sequence


@register_admission("srpt")
class SrptAdmission(ShortFirstAdmission):
    AGING = 4  # a deadline's steps per step of the prefill's own work (short-first: 1)

    def _deadline(self, seq: Sequence, todo: int, budget: int) -> float:
        return self.seen.setdefault(seq.request_id, self.step) + self.AGING * todo / max(1, budget)


@register_admission("srpt-alone")
class SrptAloneAdmission(FinishersAlone, SrptAdmission):
    pass
