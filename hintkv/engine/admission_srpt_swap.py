"""`srpt-swap` (the simulator's hinted default, `sim/run.py`): `srpt-drain` whose best waiting call
without room may swap running decodes out to the host tier, when `prefill-judged`'s judge says the
swap saves it more than it costs them.

`srpt-drain` (engine/admission_srpt.py) frees room for a refused call only by holding a longer
prefill out of the steps that carry decodes, so that they end sooner; a call whose room is held by
decodes of their own, or by a prefill whose key is earlier, waits for them to end. On the whole
trace set at full scale (docs/benchmarks/history/sim.md, twenty-fifth session, room8) half of the
hinted run's excess over each call's own prefill alone is in two windows, and one of them is 12
calls: a 697,351-token cold prompt takes 83% of the device for 493 s, its aged key is earlier than
theirs, the decodes beside its 5-11 s chunks advance one token a chunk, and a call with its prefix
resident waited 91 s for room. `prefill-judged` (engine/swap_gain.py) swaps those decodes out
(their session holds what they computed: they load back, no recompute) when the newcomer's wait it
saves, scaled by the engine's busy share, exceeds the displaced decodes' delay; a displaced decode
lets at most `MAX_OVERTAKES` new prefills go first, then goes back first (`prefill-fair`).

Everything else is `srpt-drain`'s: the order (srpt keys; displaced decodes after new prefills
until due), the room rule and its lending, the drain hold, the first-token step rule. Without a
lower tier nothing is swapped (it is `srpt-drain`). Engine knowledge, no hints: the unhinted rows
get it too (`hintkv sim --configs lru+host/srpt-swap`).
"""

from __future__ import annotations

from hintkv.engine.admission import register_admission
from hintkv.engine.admission_srpt import SrptDrainAdmission
from hintkv.engine.swap_gain import PrefillJudgedAdmission


@register_admission("srpt-swap")
class SrptSwapAdmission(PrefillJudgedAdmission, SrptDrainAdmission):
    """`prefill-judged`'s swaps, order of displaced decodes and bounded overtakes over `srpt-drain`
    (the method order: the swap hooks, `order`, `room`'s need and `skipped` come from
    `prefill-fair`/`prefill-judged`, and their `super()` calls reach `srpt-drain`'s)."""
