"""When SAM brings a waiting session's KV back from the tiers below, ahead of its predicted return.

    resume = make_resume_prefetch("once")
    resume.came_due(key, last_done)          # SAM: a predicted resume is within its lead time
    examined = resume.step(sam, now, budget)  # SAM, once per engine step, after the due ones

SAM (`cache.sam`) predicts each waiting session's return (its gap history, `GapEstimator`) and,
a lead time before it, prefetches the session's blocks that only a lower tier holds, into room
ranked below the session's own cached blocks, or below its own class when none of it is cached
(`TierConnector.prefetch`: never a higher-ranked block).
What happens after that first look is this policy's:

- `once` (the default): nothing; the first look was the only one.
- `watch` (opt-in, `--resume-prefetch watch`): the session stays watched until its call arrives (or it ends, is
  suspended, or is presumed gone); each step it is looked at again when one of its blocks left
  the device since the last step (the pool's unindex log) or its last look could not bring
  everything back, and the blocks it lost meanwhile are prefetched into room below its class
  (a session whose last look was incomplete is due again on the next step: `next_due`). Why: in
  a whole-workload `bench swarm` sam+host round (swe-agent, 778 calls), 374 of 768 resumed calls
  reloaded part of their prefix from host on the critical path (0.36 s per loaded call, load 8).
  For them the one look had fired a median 0.28 s before the call and found 72.8 of their 73
  held blocks on the device; 47 of them were evicted before the call came (other calls'
  admissions, while the session ranked below them). Room below its class opens again as other
  calls finish, so a later look could load the lost tail before the call needs it. Measured: it
  did not, and came out WORSE (2 interleaved whole-workload rounds at load 10-16, `watch` vs
  `once`: mean TTFT 0.649/0.736 vs 0.634/0.568 s, 0.693 vs 0.601 s over both rounds (+15%); p99
  2.26/3.10 vs 2.08/2.37 s; e2e per task 95/109 vs 93/84 s; load part 0.089 vs 0.082 s/call;
  that watch still had the capless fallback mended since, see docs/benchmarks/history/swarm.md). There the
  agents' tool gaps (0.29 s median) are shorter than the turnaround (0.5-1.3 s), so every
  waiting session ranks "due soon", no room below a lost session's class opens before its call,
  and a reload can only come out of another session due as soon: so it is not the default.

A look costs O(held blocks) (one index walk); the step's looks share SAM's per-step budget of
blocks examined (at least one session a step), in turn, so many watched sessions never make one
step long; finding who lost blocks costs O(blocks that left the device that step). New policies register with `@register_resume_prefetch("name")`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hintkv.registry import Registry

if TYPE_CHECKING:
    from hintkv.cache.block_pool import BlockPool
    from hintkv.cache.hashing import BlockHash
    from hintkv.cache.sam import SessionAwareManager

_REGISTRY: Registry[ResumePrefetch] = Registry("resume prefetch")
register_resume_prefetch = _REGISTRY.register


def resume_prefetch_names() -> list[str]:
    return _REGISTRY.names()


def make_resume_prefetch(name: str) -> ResumePrefetch:
    return _REGISTRY.make(name)


class ResumePrefetch:
    name = "base"

    def came_due(self, key: str, last_done: float, complete: bool) -> None:
        """SAM looked at session `key` (away since `last_done`) at its lead time; `complete`:
        everything it holds is on the device or on its way."""

    def step(self, sam: SessionAwareManager, now: float, budget: int) -> int:
        """Later looks, once per engine step, within `budget` blocks examined; returns the
        blocks examined."""
        return 0

    def next_due(self) -> float:
        """The earliest time at which `step` may act (math.inf: only when blocks leave the
        device, which a step that allocates nothing cannot do); the sim's decode stretch folds
        no step at or after it (`SessionAwareManager.next_due`)."""
        return math.inf

    def __len__(self) -> int:
        return 0


@register_resume_prefetch("once")
class Once(ResumePrefetch):
    pass


@register_resume_prefetch("watch")
class Watch(ResumePrefetch):
    def __init__(self) -> None:
        # key -> (the last_done it was predicted from, complete at its last look); in look order
        self._watched: dict[str, tuple[float, bool]] = {}
        self._holders: dict[BlockHash, set[str]] = {}  # a watched session's hash -> who watches it
        self._held: dict[str, list[BlockHash]] = {}  # key -> the hashes filed in `_holders`
        self._mark: tuple[int, int] | None = None  # where the pool's unindex log was read up to

    def came_due(self, key: str, last_done: float, complete: bool) -> None:
        self._drop(key)
        self._watched[key] = (last_done, complete)

    def step(self, sam: SessionAwareManager, now: float, budget: int) -> int:
        if not self._watched:
            return 0
        lost = self._lost(sam.kv.pool)
        tiers = sam.kv.tiers
        room: dict[int | None, bool] = {}  # class -> any room below it (O(classes) per class)
        examined = 0
        for key, (last_done, complete) in list(self._watched.items()):
            s = sam.away(key, last_done, now)
            if s is None:
                self._drop(key)  # its call came, or it ended, was suspended or is gone
                continue
            if key not in self._held:
                self._file(key, s.held)
            if lost is None or key in lost:
                complete = False  # some of it left the device since its last look
            if complete:  # all there or on its way
                self._watched[key] = (last_done, complete)
                continue
            cls = s.rank_cls  # the cap `prefetch` falls back to when none of it is cached
            if cls not in room:
                room[cls] = tiers.room_below_protected(cls) > 0
            if not room[cls]:  # nothing ranked below it to load into now
                self._watched[key] = (last_done, complete)
                continue
            if examined and examined + len(s.held) > budget:
                self._watched[key] = (last_done, False)  # over the budget: the next step's
                continue
            examined += len(s.held)
            del self._watched[key]  # looked at: to the back of the line
            self._watched[key] = (last_done, sam.prefetch_ahead(s))
        return examined

    def next_due(self) -> float:
        # a session its last look left incomplete is looked at again on the next step
        return -math.inf if any(not c for _, c in self._watched.values()) else math.inf

    def _lost(self, pool: BlockPool) -> set[str] | None:
        """Watched sessions with a block that left the device index since the last step (None:
        the log was cleared, so any may have): O(blocks that left)."""
        mark, self._mark = self._mark, pool.unindex_mark
        gone = pool.unindexed_since(*mark) if mark is not None else None
        if gone is None:
            return None
        holders = self._holders
        return {k for h in gone if h in holders for k in holders[h]}

    def _file(self, key: str, held: list[BlockHash]) -> None:
        self._held[key] = held
        for h in held:
            self._holders.setdefault(h, set()).add(key)

    def _drop(self, key: str) -> None:
        self._watched.pop(key, None)
        for h in self._held.pop(key, ()):
            keys = self._holders.get(h)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._holders[h]

    def __len__(self) -> int:
        return len(self._watched)
