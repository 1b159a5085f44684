"""`srpt`, `srpt-alone`, `srpt-room` and `srpt-drain`: `short-first` whose deadlines age `AGING` (4)
times slower, nearer shortest-remaining-prefill-first (opt-in: `--scheduling-policy srpt`), and the
variants below (`srpt-drain` was the simulator's hinted default until `srpt-swap`, engine/admission_srpt_swap.py).

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

`srpt-room` (the room a longer prefill reserves is lent): `cache-aware`'s room rule reserves every
running prefill's blocks to its end, so a shorter call that arrives while a long cold prefill runs
beside long decodes has no room although srpt's order puts it first: it waits for the whole long
prefill (10-task full-scale slice: u1-t0#1, 77.8K uncached tokens, queued 64.7 s behind a 250K-token
cold prefill with 193K tokens left, the device held by three 130-230K-token decodes). Here a
candidate may also take the blocks still reserved (not yet allocated) for running prefills whose
deadline is later than its key: they yield the step to it (`yields`), and if they later run out of
blocks the scheduler preempts the last running sequence, which in srpt's order is the longest
prefill (its computed blocks stay cached, its session holds them). What a step lends is lent
once (`room`). Its deadlines age `AGING` = 64 times slower: the steps the deadline counts include
decode-only steps (tens of ms against seconds for a long prefill's), so at 4 the long prefill's
deadline has passed the newcomer's key long before its work is done and nothing is lent.

`srpt-drain` (`srpt-swap`'s base): under `srpt-room` every call that waits beyond the
step in flight waits for room (10-task full-scale slice: in every step that left a call waiting,
the admission had refused each waiting call for room), and the room is held by decodes that run
one token per step beside a long prefill's 2-4 s chunks (median 179 output tokens, p90 717: minutes
of device held at a 100-200K context). Here, while a candidate the room rule refused waits, a
prefill whose key is later than that candidate's and whose chunk does not finish it is held from
the steps that carry decodes (`_drains`), unless it is due, and only while the decodes' ends would
cover what the candidate lacks: those steps are decode-only, tens of ms, and the decodes end and
free their room (a hold for room the decodes cannot give only made both later). A prefill whose key
is earlier is never held for it: holding every prefill moved the slice's queue into the held prefills' time (room wait 0.0996 ->
0.0083 s a call, blocked 0.039 -> 0.118, TTFT 1.5323 -> 1.5329 s). And `short-alone`'s step rule
without its chunk cap: a step that gives a prefill its first token carries no chunk of one that
does not finish (the short call's first token does not wait for a long chunk beside it). On that
slice (sam+hints+host, mean TTFT): srpt-room 1.5323 s, the key-limited hold alone 1.5113, with the
step rule (srpt-drain) 1.4933; srpt-room with `short-alone`'s rule and half-budget chunks 1.5427;
prefill chunks capped by an attention-weighted cost (n x (1 + context / 15K) <= 3.6 budgets)
1.5618; deadlines aged by the steps' work (batched tokens / budget) instead of by steps: identical
to srpt-room at aging 16 (at these agings the order is the remaining work's).

`srpt-alone` adds `short-alone`'s rule (`engine.admission_alone.FinishersAlone`): a step that gives
a prefill its first token carries no chunk of one that does not finish (unless it is due, here at
the later deadline), and a prefill with more left than the budget computes at most half of it.

Engine-only knowledge (no hints): `hintkv sim --scheduling-policy srpt` runs it on the hinted rows,
and `lru+host/srpt` on the lru one. Measured on the sim's full-scale slices (h200-llama3-8b, 10
users, block 64; docs/benchmarks/history/sim.md, fifteenth session, sched): 10 tasks, sam+hints+host mean TTFT
short-first 1.688 s, srpt 1.592, srpt-alone 1.584 (aging 16: 1.592 / 1.582, so 4 is past the knee).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from hintkv.engine.admission import ShortFirstAdmission, blocks_to_end, kept_free, register_admission
from hintkv.engine.admission_alone import FinishersAlone, finishes

if TYPE_CHECKING:
    from hintkv.cache.manager import KVCacheManager, PrefixMatch
    from hintkv.engine.admission import StepPlan
    from hintkv.engine.outputs import ScheduledSeq, SchedulerOutput
    from hintkv.engine.sequence import Sequence


@register_admission("srpt")
class SrptAdmission(ShortFirstAdmission):
    AGING = 4  # a deadline's steps per step of the prefill's own work (short-first: 1)

    def _deadline(self, seq: Sequence, todo: int, budget: int) -> float:
        return self.seen.setdefault(seq.request_id, self.step) + self.AGING * todo / max(1, budget)


@register_admission("srpt-alone")
class SrptAloneAdmission(FinishersAlone, SrptAdmission):
    pass


@register_admission("srpt-room")
class SrptRoomAdmission(SrptAdmission):
    AGING = 64  # module doc: steps include decode-only ones; at 4 nothing is lent

    def __init__(self, max_skips: int = 16, max_scan: int = 64, max_model_len: int | None = None) -> None:
        super().__init__(max_skips, max_scan, max_model_len)
        self._running: list[Sequence] = []  # the scheduler's running list, in this step's order

    def order_running(self, running: list[Sequence], budget: int) -> None:
        super().order_running(running, budget)
        self._running = running

    def lendable(self, key: float, block_size: int) -> int:
        """Blocks that running prefills whose deadline is later than `key` still reserve (to their
        end, not yet allocated)."""
        total = 0
        for s in self._running:
            todo = s.num_tokens - s.num_computed_tokens
            if todo > 1 and self._deadline(s, todo, self._budget) > key:  # (a decode never lends)
                total += max(0, blocks_to_end(s, block_size, self.max_model_len) - len(s.block_table))
        return total

    def room(self, seq: Sequence, match: PrefixMatch, kv: KVCacheManager, plan: StepPlan) -> bool:
        """`cache-aware`'s rule, plus what `lendable` gives at `seq`'s key. A borrower's own
        reservation enters `plan.reserved` at admission, so `kept_free` goes below zero by what it
        borrowed and the next candidate cannot borrow the same blocks again."""
        need = max(0, blocks_to_end(seq, kv.block_size, self.max_model_len) - match.num_held)
        free = kept_free(plan, match, kv)
        return need <= free or need <= free + self.lendable(self._waiting_key(seq, kv, self._budget),
                                                             kv.block_size)


class Refusal(NamedTuple):
    """The best-keyed call the room rule refused in a step (`SrptDrainAdmission._refused`)."""
    step: int
    key: float  # its srpt key
    short: int  # the blocks it lacked beyond the free and the lendable ones


NO_REFUSAL = Refusal(-1, float("inf"), 0)


def _decoding(s: ScheduledSeq) -> bool:
    """A decode row: one token past the prompt (a prompt's last chunk of one token is not one)."""
    return s.num_new_tokens == 1 and s.seq.num_computed_tokens >= s.seq.num_prompt_tokens


@register_admission("srpt-drain")
class SrptDrainAdmission(FinishersAlone, SrptRoomAdmission):
    """`srpt-room` with `short-alone`'s step rule (without its chunk cap), and while a candidate
    that the room rule refused waits, a prefill whose key is later than that candidate's and whose
    chunk does not finish it is held from the steps that carry decodes (unless due): module doc."""

    CHUNK_SHARE = 1.0  # no cap: half-budget chunks measured worse under srpt-room (module doc)

    def __init__(self, max_skips: int = 16, max_scan: int = 64, max_model_len: int | None = None) -> None:
        super().__init__(max_skips, max_scan, max_model_len)
        self._refused = NO_REFUSAL
        self._block_size = 1  # the KV manager's, set at the first refusal (`_drains` has no kv)

    def room(self, seq: Sequence, match: PrefixMatch, kv: KVCacheManager, plan: StepPlan) -> bool:
        if super().room(seq, match, kv, plan):
            return True
        key = self._waiting_key(seq, kv, self._budget)
        if self._refused.step != self.step or key < self._refused.key:
            bs = self._block_size = kv.block_size
            need = max(0, blocks_to_end(seq, bs, self.max_model_len) - match.num_held)
            # >= 1: the room rule refused it, so need > kept_free + lendable
            self._refused = Refusal(self.step, key, need - kept_free(plan, match, kv) - self.lendable(key, bs))
        return False

    def holds(self, seq: Sequence, n: int, out: SchedulerOutput, done: int) -> bool:
        return super().holds(seq, n, out, done) or self._drains(seq, n, out, done)

    def _drains(self, seq: Sequence, n: int, out: SchedulerOutput, done: int) -> bool:
        """True: `seq`'s chunk waits while the step's decodes run on toward their end for the room
        a better candidate, refused in this step, lacks (and the decodes' ends would
        give it)."""
        step, key, short = self._refused
        if n <= 1 or step != self.step or finishes(seq, n, done):
            return False  # (in the running pass a prefill behind a waiting refused candidate yields)
        if self._deadline(seq, seq.num_tokens - done, self._budget) <= max(key, self.step):
            return False  # placed before the refused candidate, or due (no starvation)
        # only while the decodes' ends can make the room it lacks: else both wait for nothing
        bs = self._block_size
        freed = sum(blocks_to_end(s.seq, bs, self.max_model_len) for s in out.scheduled if _decoding(s))
        return freed >= short
