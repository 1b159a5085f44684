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

The rule (`holds`): a prefill whose chunk would not finish its prompt (counted from what it has
computed; a waiting candidate's is its resident prefix) is not scheduled in a step that already
gives some request a token it had to compute for (a prompt's first, or a recompute's); exceptions:

- a *due* prefill (its `short-first` deadline, first seen + its tokens to compute / step budget,
  has passed) is never held, and keys only age, so newcomers (deadline = now + their work) sort
  behind it. No starvation, but a looser bound than `short-first`'s (about twice its own steps):
  its deadline plus its own steps at the capped chunk, i.e. up to 2x as many (tested: 20 + 40 + 4
  steps for a 1280-token prompt under a budget of 64, against 2 x 20 + 4);
- the head `make_room` swapped decodes out for is not held in that step (the swap paid for it);
- a running prefill also yields its place in the step's order to a waiting candidate that would
  finish within the budget (`yields`), unless it is due;
- a step with no finishing prefill fills the budget as `short-first` does (the held chunk runs then).

And (`chunk`) a prefill with more tokens left than the step budget computes at most half the budget
per step (`CHUNK_SHARE`), so a short call arriving during its step waits for a step half as long,
even with nothing else queued. Its cost is the long prompt's: one 90K-cached chunk costs little
more halved (two 4096-token chunks 1686 ms against 1696 ms for one of 8192), but a whole fresh
prompt's prefill grows on the same cost model (8192 -> 4096-token chunks: 16K +9.1%, 32K +5.8%,
90K +2.6%; more with decodes beside it), and the profile charges no per-step overhead, which real
engines pay for twice the steps. `short-first` with a 4096-token budget gives about the same
(1.63 s on the slice below): the gain is the smaller chunk, not the step rule. On the
sim's 10-task full-scale slice (h200-llama3-8b, 10 users, block 64; docs/benchmarks/history/swarm.md) mean TTFT:
lru+host under short-first 1.707 s, short-alone without the cap 1.700 s, with it 1.663 s;
sam+hints+host 1.688 / 1.682 / 1.646 s (with the cap: after the fix that counts a waiting resume's
resident prefix as computed; before it, 1.634 / 1.650): the gain is the scheduler's, not the hints'.

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


def finishes(seq: Sequence, n: int, done: int) -> bool:
    """True: `n` new tokens after the `done` computed (a waiting candidate's: its resident prefix,
    `match.num_tokens`; its `num_computed_tokens` is 0 until `kv.admit`) complete what `seq` has to
    compute and so sample a token in this step: a prompt's first token, or a preempted sequence's
    recompute of its prompt and outputs (more than one token to go). A decode (one token to go,
    past its first token) is not a finisher: every step has them."""
    if done + n < seq.num_tokens:
        return False
    return seq.first_token_time is None or seq.num_tokens - done > 1


class FinishersAlone:
    """The rule, mixed into a `short-first` policy (needs its `_deadline`, `_waiting_key`, `step`)."""

    CHUNK_SHARE = 0.5  # of the step budget: the most a prefill that cannot finish in a step computes in it

    def chunk(self, todo: int, n: int, used: int = 0, done: int = 0) -> int:
        if todo <= self._budget or n <= 1:
            return n  # it may finish in this step
        return min(n, max(1, int(self._budget * self.CHUNK_SHARE)))

    def _aged(self, seq: Sequence, todo: int, budget: int) -> bool:
        return self._deadline(seq, todo, budget) <= self.step

    def holds(self, seq: Sequence, n: int, out: SchedulerOutput, done: int) -> bool:
        if n <= 1 or finishes(seq, n, done) or self._room_for == (self.step, seq.request_id):
            return False  # (the head `make_room` swapped decodes out for runs in this step)
        if not any(finishes(s.seq, s.num_new_tokens, s.seq.num_computed_tokens) for s in out.scheduled):
            return False
        return not self._aged(seq, seq.num_tokens - done, self._budget)

    _room_for: tuple[int, str] | None = None

    def made_room(self, seq: Sequence) -> None:
        self._room_for = (self.step, seq.request_id)

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
