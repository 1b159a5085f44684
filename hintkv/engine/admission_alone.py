"""`short-alone` and `judged-alone`: a step that gives a prefill its first token carries no chunk
of a prefill that does not finish in it (unless that one is due).

A forward step's time grows with every token in it (`sim.costs`: a chunk of new tokens costs its
cold compute plus its attention over its cached prefix, summed over the step's chunks), and every
prefill finishing in the step gets its first token only when the whole step ends. Under
`short-first` a long prefill's chunk fills what the short ones leave of the budget (or shares the
step with them, `cap`), so a 300-token resume on a 90K-token context, 0.13 s alone on the
h200-llama3-8b profile, waits for the 1.7 s step of the long prompt's 8K-token chunk beside it.
The long prefill gains nothing from that chunk it would not get one step later: it does not finish
in this step either way, and its own first token comes after the same total work. So, as
shortest-remaining-processing-time does (it minimizes the mean time to completion on one server),
the step holds the long chunk back while a prefill finishes, and the step is short.

The rule (`holds`): a prefill whose chunk would not finish its prompt is not scheduled in a step
that already gives some request its first token; the exceptions keep every bound of `short-first`:

- a *due* prefill (its `short-first` deadline, first seen + its tokens to compute / step budget,
  has passed) is never held, and keys only age, so newcomers (deadline = now + their work) sort
  behind it: it waits at most about as long again as it computes (no starvation; tested);
- a running prefill also yields its place in the step's order to a waiting candidate that would
  finish within the budget (`yields`), unless it is due;
- a step with no finishing prefill fills the budget as `short-first` does (the held chunk runs then).

And (`chunk`) a prefill with more tokens left than the step budget computes at most half the budget
per step (`CHUNK_SHARE`), so a short call arriving during its step waits for a step half as long.
The cost model says this costs the long one almost nothing: at 90K cached tokens two 4096-token
chunks take 1686 ms against 1696 ms for one of 8192 (attention over the prefix dominates). On the
sim's 10-task full-scale slice (h200-llama3-8b, 10 users, block 64; docs/benchmarks.md) mean TTFT:
lru+host under short-first 1.707 s, short-alone without the cap 1.700 s, with it 1.634 s;
sam+hints+host 1.688 / 1.682 / 1.650 s: the gain is the scheduler's, not the hints'.

Engine-only knowledge (no hints): `hintkv sim --scheduling-policy short-alone` prints it alone on
the lru rows (`lru+host/short-alone`), `bench swarm --runs lru+host/ja,sam+host/ja` likewise.
`judged-alone` is `prefill-judged` (the live swarm's hinted scheduler: swapping decodes out for a
prefill when it pays) with this rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from hintkv.engine.admission import ShortFirstAdmission, register_admission
from hintkv.engine.swap_gain import PrefillJudgedAdmission

if TYPE_CHECKING:
    from hintkv.cache.manager import KVCacheManager
    from hintkv.engine.outputs import SchedulerOutput
    from hintkv.engine.sequence import Sequence


def finishes(seq: Sequence, n: int) -> bool:
    """True: `n` new tokens complete `seq`'s prompt and give it its first token in this step."""
    return seq.first_token_time is None and seq.num_computed_tokens + n >= seq.num_tokens


class FinishersAlone:
    """The rule, mixed into a `short-first` policy (needs its `_deadline`, `_waiting_key`, `step`)."""

    CHUNK_SHARE = 0.5  # of the step budget: the most a prefill that cannot finish in a step computes in it

    def chunk(self, todo: int, n: int) -> int:
        if todo <= self._budget or n <= 1:
            return n  # it may finish in this step
        return min(n, max(1, int(self._budget * self.CHUNK_SHARE)))

    def _aged(self, seq: Sequence, todo: int, budget: int) -> bool:
        return self._deadline(seq, todo, budget) <= self.step

    def holds(self, seq: Sequence, n: int, out: SchedulerOutput) -> bool:
        if n <= 1 or finishes(seq, n):
            return False
        if not any(finishes(s.seq, s.num_new_tokens) for s in out.scheduled):
            return False
        return not self._aged(seq, seq.num_tokens - seq.num_computed_tokens, self._budget)

    def yields(self, seq: Sequence, waiting: Iterable[Sequence], kv: KVCacheManager, budget: int) -> bool:
        if super().yields(seq, waiting, kv, budget):
            return True
        todo = seq.num_tokens - seq.num_computed_tokens
        if todo <= budget or self._aged(seq, todo, budget):
            return False
        head = list(waiting)[:self.max_scan]
        return any(s.num_tokens - self._resident_tokens(s, kv, budget) <= budget for s in head)

    def _resident_tokens(self, seq: Sequence, kv: KVCacheManager, budget: int) -> int:
        self._waiting_key(seq, kv, budget)  # looks the resident (and held-below) run up, cached
        return self.resident[seq.request_id][0]


@register_admission("short-alone")
class ShortAloneAdmission(FinishersAlone, ShortFirstAdmission):
    pass


@register_admission("judged-alone")
class JudgedAloneAdmission(FinishersAlone, PrefillJudgedAdmission):
    pass
