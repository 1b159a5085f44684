"""Admission: which waiting sequences the scheduler starts, in what order, by name.

    policy = make_admission("cache-aware")
    for seq in policy.order(waiting, kv):           # candidates, best first
        ... room = policy.room(seq, match, kv, plan)  # blocks it may take without hurting others

- `fcfs` (vLLM's default, the `lru` baseline "vLLM + automatic prefix caching"): arrival order;
  the first sequence that does not fit stops admission (no skipping). A sequence is admitted with
  blocks for its first prefill chunk only; later chunks and decode allocate as they go, evicting
  cached blocks (or preempting the newest running sequence) when the pool is full.
- `cache-aware` (SGLang's longest-prefix-match order with a reservation): candidates with the
  longest prefix resident on the device go first, arrival order breaks ties; a sequence
  is admitted only when the blocks it will need to the end (rest of the prompt + `max_tokens`)
  fit beside what every running, loading or already admitted sequence still needs, and beside the
  resident prefixes of better-placed candidates that are still waiting. So concurrent prefills
  never evict each other's prefixes and nothing admitted is preempted for room. A candidate that
  does not fit is skipped (the ones behind it may fit); one skipped `max_skips` times is starving
  and goes first, in arrival order, and nothing is admitted past it until it fits (no starvation).
  With nothing running at all a candidate is admitted on the plain chunk rule, so one request
  larger than the reservation allows still runs.
- `short-first` (shortest remaining prefill first, aged; `cache-aware`'s room rule): a sequence's
  key is a deadline in steps, `first seen + tokens it still has to compute / step budget` (a
  waiting one's resident prefix counts as computed, and so does the run after it that a lower tier
  holds and is worth loading (`held_below`; a session whose context was written to the host is
  short too, instead of waiting behind shorter cold prompts while its blocks age out below).
  Running decodes go first; then running prefills and waiting candidates compete by key: a
  running prefill whose key is later than the best waiting candidate's yields the step to it
  and gets what budget is left. So a 100K-token prefill no longer holds the whole budget
  for tens of steps while short prefills queue behind it (head-of-line blocking), and because
  keys only age, a long one is overtaken only by sequences that arrived before its own deadline:
  it waits at most about as long again as it computes (no starvation).
- `prefill-first`, `prefill-fair`, `prefill-judged`: `short-first` plus swapping running decodes out
  to the host tier for a new prefill without room (`hintkv.engine.admission_swap`; `prefill-judged`
  swaps only when the newcomer's wait it saves exceeds the displaced decodes' delay, from the
  engine's measured step costs and load: `hintkv.engine.swap_gain`).

- `short-alone`, `judged-alone`: `short-first` / `prefill-judged` whose steps that give a prefill its
  first token carry no chunk of a prefill that does not finish in them (unless it is due):
  `hintkv.engine.admission_alone`.
- `srpt`, `srpt-alone`: `short-first` / `short-alone` whose deadlines age 4x slower (nearer shortest
  remaining prefill first; a long prefill waits at most about 4x its own steps):
  `hintkv.engine.admission_srpt`.
- `srpt-room`: `srpt` (deadlines aged 64x slower) whose candidate may take the blocks a running
  prefill with a later deadline still reserves (`hintkv.engine.admission_srpt`).

The scheduler keeps the mechanics (budget, loads, preemption, out-of-room); a policy only orders
and sizes. New policies register with `@register_admission("name")`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hintkv.registry import Registry

if TYPE_CHECKING:
    from hintkv.cache.manager import KVCacheManager, PrefixMatch
    from hintkv.engine.outputs import SchedulerOutput
    from hintkv.engine.sequence import Sequence

_REGISTRY: Registry[AdmissionPolicy] = Registry("scheduling policy")
register_admission = _REGISTRY.register


def admission_names() -> list[str]:
    return _REGISTRY.names()


def make_admission(name: str, **kwargs) -> AdmissionPolicy:
    return _REGISTRY.make(name, **kwargs)


OFFLINE_ONLY: dict[str, str] = {}  # name -> why only the offline replay can run it (its module files it)


def live_admission_names() -> list[str]:
    """The names the live engine runs (serve, the simulator's engine, bench swarm_sched)."""
    return [n for n in admission_names() if n not in OFFLINE_ONLY]


def live_admission_error(name: str) -> str | None:
    """Why the live engine refuses `name` (a usage error), or None."""
    why = OFFLINE_ONLY.get(name)
    return None if why is None else f"{name} is an offline-replay study policy: {why}"


@dataclass(slots=True)
class StepPlan:
    """What this step's admissions have promised so far (blocks not allocated yet)."""

    reserved: int = 0  # blocks running / loading / admitted sequences will still allocate
    # block ids of skipped candidates' resident prefixes (a lapsed one's are not kept: `skipped`)
    kept: set[int] = field(default_factory=set)
    passed: list[str] = field(default_factory=list)  # request ids of skipped candidates, in order


class AdmissionPolicy:
    name = "base"
    reserves = False  # True: the scheduler tracks StepPlan.reserved for `room`
    swaps = False  # True: a new prefill without room may preempt running decodes (engine.admission_swap)

    def __init__(self, max_model_len: int | None = None) -> None:
        self.max_model_len = max_model_len

    def order(self, waiting: Iterable[Sequence], kv: KVCacheManager) -> list[Sequence]:
        raise NotImplementedError

    def order_running(self, running: list[Sequence], budget: int) -> None:
        """Sort `running` in place into the order the step's budget is handed out (and the
        reverse of preemption's): default FCFS, as admitted."""

    def yields(self, seq: Sequence, waiting: Iterable[Sequence], kv: KVCacheManager, budget: int) -> bool:
        """True: running prefill `seq` waits until the waiting candidates had their turn. Never
        True for a decode (one token to go): the scheduler batches decodes without asking."""
        return False

    def short_rest(self, seq: Sequence) -> bool:
        """True: running prefill `seq` ends within half a step (more than one token left, at most
        half the step's whole budget, not the budget left). Such a prefill neither yields nor is
        capped, and a long prefill ahead of it shares the step with it (`batching._short_after`)."""
        return False

    def cap(self, seq: Sequence, n: int, budget: int, others_wait: bool) -> int:
        """The tokens running `seq` takes now out of `n` (the rest of the budget, `budget`, may
        come back to it once the waiting candidates had theirs). A decode (`n == 1`) keeps its
        token: the scheduler batches decodes without asking."""
        return n

    def room(self, seq: Sequence, match: PrefixMatch, kv: KVCacheManager, plan: StepPlan) -> bool:
        """True: admitting `seq` to the end takes no block anyone ahead of it needs."""
        return True

    def chunk(self, todo: int, n: int, used: int = 0, done: int = 0) -> int:
        """The tokens a prefill with `todo` prompt tokens left computes in this step, of the `n`
        the budget leaves it (at least one when `n` is; `engine.admission_alone` caps a long one),
        with `used` tokens already in the step (decodes included) and `done` tokens of its own
        already computed (the chunk's context; a candidate's: its resident prefix). A query: the
        scheduler may ask for a chunk it then does not run (refused, held), so nothing is charged here."""
        return n

    def holds(self, seq: Sequence, n: int, out: SchedulerOutput, done: int) -> bool:
        """True: `seq` (running, or a candidate with room), `done` tokens computed (a candidate's:
        its resident prefix), does not take its `n`-token chunk in the step `out` holds so far (it
        stays running or waiting; `engine.admission_alone`)."""
        return False

    def made_room(self, seq: Sequence) -> None:
        """`make_room` swapped decodes out for waiting `seq` in this step (`holds` must let it run)."""

    def attach_returns(self, returns: Callable[[], tuple[float, float]]) -> bool:
        """A scheduler with hints and SAM offers `returns` (`Scheduler.next_return`: seconds until
        SAM's next predicted call of a session away on its tool, and the engine's prefill seconds a
        token); a policy that reads it keeps it and says True, and SAM then tracks the returns
        (`engine.admission_resume`). By default it is not read."""
        return False

    def attach_landings(self, landings: Callable[[], float]) -> None:
        """Every scheduler offers `landings` (`Scheduler.next_landing`: seconds until a load in
        flight is expected to have landed, inf when none); a policy that reads it keeps it
        (`engine.admission_land`). By default it is not read."""

    def skipped(self, seq: Sequence, match: PrefixMatch, plan: StepPlan,
                lapse: Callable[[], bool] | None = None) -> bool:
        """`seq` did not fit; True: try the next candidate, False: stop admitting this step. What a
        skipped candidate keeps from the ones after it (`plan.kept`, `plan.reserved`) is decided
        here alone: its resident prefix (`match`) is kept unless `lapse()` says its wait for room
        is longer than getting the prefix back (`engine.room_wait.lapses`; asked only where the
        policy would keep it, never for a candidate it reserves room for)."""
        return False

    def admitted(self, seq: Sequence, plan: StepPlan) -> None:
        """`seq` was admitted (past the candidates in `plan.passed`)."""

    def stepped(self, sched: SchedulerOutput, now: float) -> None:
        """A step scheduled at `sched.started` ended at `now` (the scheduler's clock)."""

    def forget(self, request_id: str) -> None:
        """The request left (finished or aborted)."""

    def check_integrity(self) -> None:
        pass


@register_admission("fcfs")
class FCFSAdmission(AdmissionPolicy):
    def order(self, waiting: Iterable[Sequence], kv: KVCacheManager) -> list[Sequence]:
        return list(waiting)


def blocks_to_end(seq: Sequence, block_size: int, max_model_len: int | None = None) -> int:
    """Blocks `seq` holds when it ends: its prompt plus the rest of `max_tokens`."""
    end = seq.num_prompt_tokens + seq.sampling.max_tokens
    if max_model_len is not None:
        end = min(end, max_model_len)
    return -(-max(end, seq.num_tokens) // block_size)


def resident_blocks(seq: Sequence, kv: KVCacheManager) -> int:
    """Leading blocks of `seq`'s prompt cached on the device (no tier lookups: this runs per
    waiting sequence per step; a run held below is found and loaded at admission)."""
    return len(kv.device_run(seq.request_id, kv.update_hashes(seq, seq.num_tokens - 1)))


def kept_free(plan: StepPlan, match: PrefixMatch, kv: KVCacheManager) -> int:
    """Free device blocks for `match`'s request this step: `free_room` less the step's reservations
    and the free blocks kept for skipped candidates' prefixes (unreferenced, not in `match`)."""
    kept = 0
    if plan.kept:  # (the matched ids' set only then: a full-scale prompt matches ~2,000 blocks)
        mine = {b.block_id for b in match.blocks}
        blocks = kv.pool.blocks
        kept = sum(1 for bid in plan.kept if bid not in mine and blocks[bid].ref_cnt == 0)
    return kv.free_room(match) - plan.reserved - kept


@register_admission("cache-aware")
class CacheAwareAdmission(AdmissionPolicy):
    reserves = True

    def __init__(self, max_skips: int = 16, max_scan: int = 64, max_model_len: int | None = None) -> None:
        if max_skips < 0 or max_scan < 1:
            raise ValueError("max_skips must be >= 0 and max_scan >= 1")
        self.max_skips = max_skips
        self.max_scan = max_scan  # waiting sequences ranked per step (the rest keep arrival order)
        self.max_model_len = max_model_len
        self.skips: dict[str, int] = {}  # request id -> times skipped by a later arrival

    def order(self, waiting: Iterable[Sequence], kv: KVCacheManager) -> list[Sequence]:
        seqs = list(waiting)
        head, tail = seqs[:self.max_scan], seqs[self.max_scan:]
        starving = [s for s in head if self.skips.get(s.request_id, 0) >= self.max_skips]
        rest = [s for s in head if self.skips.get(s.request_id, 0) < self.max_skips]
        rank = {}
        for i, s in enumerate(rest):
            rank[s.request_id] = (-resident_blocks(s, kv), i)
        rest.sort(key=lambda s: rank[s.request_id])
        return starving + rest + tail

    def room(self, seq: Sequence, match: PrefixMatch, kv: KVCacheManager, plan: StepPlan) -> bool:
        need = max(0, blocks_to_end(seq, kv.block_size, self.max_model_len) - match.num_held)
        return need <= kept_free(plan, match, kv)

    def skipped(self, seq: Sequence, match: PrefixMatch, plan: StepPlan,
                lapse: Callable[[], bool] | None = None) -> bool:
        if self.skips.get(seq.request_id, 0) >= self.max_skips:
            return False  # starving: nothing goes past it
        plan.passed.append(seq.request_id)
        # lapsed, it adds nothing: the blocks an earlier skipped candidate keeps stay kept; the
        # later admissions past it are bounded by `max_skips` (each one overtakes it once)
        if lapse is None or not lapse():
            plan.kept.update(b.block_id for b in match.blocks if b.hash is not None)
        return True

    def admitted(self, seq: Sequence, plan: StepPlan) -> None:
        self.skips.pop(seq.request_id, None)
        for rid in plan.passed:  # each skipped candidate was overtaken once more
            self.skips[rid] = self.skips.get(rid, 0) + 1

    def forget(self, request_id: str) -> None:
        self.skips.pop(request_id, None)


@register_admission("short-first")
class ShortFirstAdmission(CacheAwareAdmission):
    REFRESH_STEPS = 8  # a waiting sequence's resident prefix is looked up again after this many steps

    def __init__(self, max_skips: int = 16, max_scan: int = 64, max_model_len: int | None = None) -> None:
        super().__init__(max_skips, max_scan, max_model_len)
        self.step = 0
        self.seen: dict[str, int] = {}  # request id -> step first seen
        self.resident: dict[str, tuple[int, int]] = {}  # request id -> (resident tokens, step looked up)
        self._best: tuple[int, float] | None = None  # (step, best waiting key) cache
        self._budget = 1  # this step's token budget (set by order_running)
        # hashes -> the leading run of them lower tiers hold; None: the KV manager's tier connector
        # (the offline replay, whose host tier is bookkeeping, gives its own)
        self.held_below: Callable[[list], int] | None = None

    def _deadline(self, seq: Sequence, todo: int, budget: int) -> float:
        return self.seen.setdefault(seq.request_id, self.step) + todo / max(1, budget)

    def _held_below(self, seq: Sequence, kv: KVCacheManager, after: int) -> int:
        """Blocks after the device's `after` that a lower tier holds (a leading run, worth loading)."""
        hashes = kv.update_hashes(seq, seq.num_tokens - 1)[after:]
        if not hashes:
            return 0
        if self.held_below is not None:
            return self.held_below(hashes)
        return len(kv.tiers.plan(hashes)) if kv.tiers is not None else 0

    def _waiting_key(self, seq: Sequence, kv: KVCacheManager, budget: int) -> float:
        got = self.resident.get(seq.request_id)
        if got is None or self.step - got[1] >= self.REFRESH_STEPS:
            n = resident_blocks(seq, kv)
            got = ((n + self._held_below(seq, kv, n)) * kv.block_size, self.step)
            self.resident[seq.request_id] = got
        return self._deadline(seq, seq.num_tokens - got[0], budget)

    def order_running(self, running: list[Sequence], budget: int) -> None:
        self.step += 1
        self._budget = budget

        def key(s: Sequence) -> tuple[int, float]:
            todo = s.num_tokens - s.num_computed_tokens
            return (0, 0.0) if todo <= 1 else (1, self._deadline(s, todo, budget))
        running.sort(key=key)  # stable: decodes keep their admission order

    def short_rest(self, seq: Sequence) -> bool:
        return 1 < seq.num_tokens - seq.num_computed_tokens <= max(1, self._budget // 2)

    def yields(self, seq: Sequence, waiting: Iterable[Sequence], kv: KVCacheManager, budget: int) -> bool:
        todo = seq.num_tokens - seq.num_computed_tokens
        # a decode, or a prefill that ends within half a step: the step holds it and half for the
        # candidates; yielded, it waits until the admissions leave budget, and an aged long prefill
        # ahead of it takes that back (issue #9: 317 tokens waited 117 s behind a 155K-token one)
        if todo <= 1 or self.short_rest(seq):
            return False
        if self._best is None or self._best[0] != self.step:
            head = list(waiting)[:self.max_scan]
            best = min((self._waiting_key(s, kv, budget) for s in head), default=float("inf"))
            self._best = (self.step, best)
        return self._best[1] < self._deadline(seq, todo, budget)

    def cap(self, seq: Sequence, n: int, budget: int, others_wait: bool) -> int:
        # an aged long prefill shares the step (processor sharing); one that ends within half a
        # step is short, as in `yields`: its whole rest (halved, a 12-token rest behind a capped
        # long one took 6, 3, ... tokens a step: the budget LEFT is half the step there)
        if others_wait and n > 1 and n > budget // 2 and not self.short_rest(seq):
            return max(1, budget // 2)
        return n

    def order(self, waiting: Iterable[Sequence], kv: KVCacheManager) -> list[Sequence]:
        seqs = list(waiting)
        head, tail = seqs[:self.max_scan], seqs[self.max_scan:]
        budget = self._budget
        starving = [s for s in head if self.skips.get(s.request_id, 0) >= self.max_skips]
        rest = [s for s in head if self.skips.get(s.request_id, 0) < self.max_skips]
        keys = {s.request_id: (self._waiting_key(s, kv, budget), i) for i, s in enumerate(rest)}
        rest.sort(key=lambda s: keys[s.request_id])
        return starving + rest + tail

    def admitted(self, seq: Sequence, plan: StepPlan) -> None:
        super().admitted(seq, plan)
        self.resident.pop(seq.request_id, None)

    def forget(self, request_id: str) -> None:
        super().forget(request_id)
        self.seen.pop(request_id, None)
        self.resident.pop(request_id, None)

    def check_integrity(self) -> None:
        assert all(v <= self.step for v in self.seen.values()), "a sequence seen in a future step"


from hintkv.engine import admission_swap  # noqa: E402,F401  (registers the swapping policies)
from hintkv.engine import swap_gain  # noqa: E402,F401  (registers prefill-judged)
from hintkv.engine import admission_serial  # noqa: E402,F401  (registers cache-aware-serial)
from hintkv.engine import admission_alone  # noqa: E402,F401  (registers short-alone, judged-alone)
from hintkv.engine import admission_srpt  # noqa: E402,F401  (registers srpt, srpt-alone, srpt-room, srpt-drain)
from hintkv.engine import admission_resume  # noqa: E402,F401  (registers srpt-resume)
from hintkv.engine import admission_cap  # noqa: E402,F401  (registers srpt-cap)
from hintkv.engine import admission_land  # noqa: E402,F401  (registers srpt-land)
from hintkv.engine import admission_srpt_swap  # noqa: E402,F401  (registers srpt-swap)
