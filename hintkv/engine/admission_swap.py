"""Admission policies that swap running decodes out for a new prefill (`AdmissionPolicy.swaps`).

Both are `short-first` (`hintkv.engine.admission`) plus `batching.make_room`: when the best
waiting request that has not had its first token has no room, running decodes (past their first
token, never preempted before) are preempted for it, most output left first. Their blocks go down
to the host tier as they are evicted (under hints their session holds what the request computed)
and load back: a swap, not a recompute. Without a lower tier nothing is swapped (it is
`short-first`). On a small device most of a waiting request's wait is decodes holding the blocks,
so a swap turns that wait into TTFT saved; what it costs is the displaced decode's delay.

- `prefill-first`: a displaced decode waits behind every new prefill, including the ones that
  arrive after it, and further swaps go on while it waits. TTFT is short, but in a busy swarm
  displaced decodes queue behind a stream of newcomers: calls get long (issue 8, session 8: task
  time +7-16% over `lru+host` under fcfs on swe-agent, simulated).
- `prefill-fair` (bounded loss): a displaced decode lets at most `MAX_OVERTAKES` new prefills go
  first (the newcomer it made room for is the first); then it is due: it goes back first, ahead of
  every new prefill, while a due one waits nothing more is swapped out, and a candidate behind it
  is admitted only when it fits beside it (its blocks to the end are reserved). So a decode loses
  a bounded number of newcomers' prefills, not a stream of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from hintkv.engine.admission import ShortFirstAdmission, StepPlan, blocks_to_end, register_admission

if TYPE_CHECKING:
    from hintkv.cache.manager import KVCacheManager, PrefixMatch
    from hintkv.engine.sequence import Sequence


MAX_OVERTAKES = 4  # new prefills a displaced decode lets go first (measured in `bench swarm_sched`: docs/benchmarks/history/swarm.md)


def swap_frees(seq: Sequence, block_size: int, max_model_len: int | None) -> int:
    """Blocks a running sequence gives back when swapped out (or when it ends): the ones only it
    holds, and the ones it would still have allocated to reach its end."""
    return (sum(1 for b in seq.block_table if b.ref_cnt == 1)
            + max(0, blocks_to_end(seq, block_size, max_model_len) - len(seq.block_table)))


def displaced(seq: Sequence) -> bool:
    """A waiting sequence that had its first token: a decode swapped (or preempted) out."""
    return seq.first_token_time is not None


@register_admission("prefill-first")
class PrefillFirstAdmission(ShortFirstAdmission):
    """`short-first`; a new prefill without room swaps running decodes out, and they wait behind
    every new prefill."""

    swaps = True

    def swap_victims(self, decodes: list[Sequence]) -> list[Sequence]:
        """Running decodes (past their first token, never preempted before) in the order they are
        preempted to make room for a new prefill (`batching.make_room` stops as soon as the room is
        there, and preempts nobody if all of them would not make it): most output left first."""
        return sorted(decodes, key=lambda s: (s.num_output_tokens - s.sampling.max_tokens, -len(s.block_table)))

    def may_swap(self, waiting: Iterable[Sequence]) -> bool:
        """False holds every running decode this step (no swap is considered)."""
        return True

    def swap_pays(self, head: Sequence, victims: list[Sequence], enders: list[Sequence], short: int,
                  cached_blocks: int, kv: KVCacheManager) -> bool:
        """Preempting `victims` (enough for `head`, `short` blocks short of room, `cached_blocks`
        of its prompt on the device) is worth it; `enders` are every running sequence, whose
        ends free room too."""
        return True

    def order(self, waiting: Iterable[Sequence], kv: KVCacheManager) -> list[Sequence]:
        ranked = super().order(waiting, kv)  # new prefills first: a decode set aside waits for them
        return [s for s in ranked if not displaced(s)] + [s for s in ranked if displaced(s)]


@register_admission("prefill-fair")
class PrefillFairAdmission(PrefillFirstAdmission):
    """`prefill-first` whose displaced decodes are overtaken by at most `max_overtakes` new
    prefills each; then they go back first, with no further swap while one waits (see the module
    docstring)."""

    def __init__(self, max_overtakes: int = MAX_OVERTAKES, max_skips: int = 16, max_scan: int = 64,
                 max_model_len: int | None = None) -> None:
        super().__init__(max_skips, max_scan, max_model_len)
        if max_overtakes < 1:  # the newcomer it was displaced for goes first: that is the swap
            raise ValueError("max_overtakes must be >= 1")
        self.max_overtakes = max_overtakes
        self.overtaken: dict[str, int] = {}  # displaced request id -> new prefills admitted past it
        self._waiting_displaced: list[str] = []  # as of the last `order`
        self._need: tuple[str, int] = ("", 0)  # (request id, blocks to its end) of the candidate `room` last judged

    def _due(self, seq: Sequence) -> bool:
        return displaced(seq) and self.overtaken.get(seq.request_id, 0) >= self.max_overtakes

    def order(self, waiting: Iterable[Sequence], kv: KVCacheManager) -> list[Sequence]:
        ranked = ShortFirstAdmission.order(self, waiting, kv)
        self._waiting_displaced = [s.request_id for s in ranked if displaced(s)]
        due = [s for s in ranked if self._due(s)]
        return due + [s for s in ranked if not displaced(s)] + [s for s in ranked if displaced(s) and not self._due(s)]

    def may_swap(self, waiting: Iterable[Sequence]) -> bool:
        return not any(self._due(s) for s in waiting)

    def room(self, seq: Sequence, match: PrefixMatch, kv: KVCacheManager, plan: StepPlan) -> bool:
        self._need = (seq.request_id, max(0, blocks_to_end(seq, kv.block_size, self.max_model_len) - match.num_held))
        return super().room(seq, match, kv, plan)

    def skipped(self, seq: Sequence, match: PrefixMatch, plan: StepPlan,
                lapse: Callable[[], bool] | None = None) -> bool:
        due = self._due(seq)  # its room is reserved beside its resident prefix: that never lapses
        if not super().skipped(seq, match, plan, None if due else lapse):
            return False
        rid, need = self._need
        if due and rid == seq.request_id:  # whoever goes past it leaves it room to come back
            plan.reserved += need
        return True

    def admitted(self, seq: Sequence, plan: StepPlan) -> None:
        super().admitted(seq, plan)
        if displaced(seq):
            self.overtaken.pop(seq.request_id, None)
            if seq.request_id in self._waiting_displaced:  # no longer waiting: a later admission
                self._waiting_displaced.remove(seq.request_id)  # this step does not overtake it
            return
        for rid in self._waiting_displaced:
            self.overtaken[rid] = self.overtaken.get(rid, 0) + 1

    def forget(self, request_id: str) -> None:
        super().forget(request_id)
        self.overtaken.pop(request_id, None)

    def check_integrity(self) -> None:
        super().check_integrity()
        assert all(v >= 1 for v in self.overtaken.values()), "an overtake count below one"
        assert self.overtaken.keys() <= set(self._waiting_displaced), \
            "an overtake count for a request that is not a waiting displaced decode"
