"""The eviction audit: where a policy loses to Belady, victim by victim, in the offline replay.

    audit = audit_evictions(workload, OfflineConfig(policy="sam", hints=True, device_blocks=800), memo)
    audit.rows()          # cause -> wrong victims, their share, and what the oracle would have taken

Two passes of one deterministic replay. The first records the block accesses (so every block's
future reads are known); the second hooks the device pool's eviction and, at each reclaim of
k blocks, compares the policy's victims with the k blocks among the same candidates (every cached
block no running request holds, at that moment) that Belady would take: the farthest next read.
A victim read again sooner than the k-th farthest candidate is a WRONG victim (a hit the policy
gave away at that moment; counted once per eviction, so a block lost twice counts twice). Each
wrong victim gets one cause:

    unheld, read again         no live session held it (an ended session's block, an orphaned
                               context) and a later prompt reads it
    order inside a session     the oracle would have taken a block of the same session instead
                               (its head vs its tail, a context it will not read again)
    ranked lower: <state>      its holder's class was below the oracle's pick's: the policy
                               predicted a later return than the pick's, wrongly
    same class: <state>        same class as the oracle's pick: the order inside a class (LRU
                               of groups) decided

<state> is the victim's most protective holder: in flight, waiting on a tool, a leader waiting on
sub-agents, presumed gone (idle beyond its usual gap), suspended, prefetched; "(sub-agent)" when
that holder has a parent. For victims waiting on a tool the audit also keeps the policy's
predicted return against the actual one (the gap prediction's error). Observation only: the
hook reads the pool, sessions and policy and changes nothing (the replay's hit rate is the same
with and without it; a test checks).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from hintkv.cache.sessions import SessionState
from hintkv.replay.offline import OfflineConfig, OfflineEngine, replay_offline
from hintkv.workload.program import Workload

NEVER = math.inf


@dataclass(slots=True)
class EvictionAudit:
    hit_rate: float = 0.0
    prompt_tokens: int = 0
    block_size: int = 16
    evicted: int = 0  # victims, all evictions
    wrong: int = 0  # victims read again sooner than the oracle's k-th pick at that moment
    causes: Counter = field(default_factory=Counter)  # cause -> wrong victims
    instead: Counter = field(default_factory=Counter)  # the oracle's pick's state -> wrong victims
    next_reader: Counter = field(default_factory=Counter)  # wrong victims: read next by a holder or another
    gap_ratio: list[float] = field(default_factory=list)  # on a tool (suspended too): actual / predicted return

    def rows(self) -> list[dict[str, Any]]:
        return [{"cause": c, "wrong": n, "share": n / self.wrong if self.wrong else 0.0}
                for c, n in self.causes.most_common()]

    def summary(self) -> dict[str, Any]:
        r = sorted(self.gap_ratio)
        return {"hit_rate": self.hit_rate, "evicted": self.evicted, "wrong": self.wrong,
                "wrong_share": self.wrong / self.evicted if self.evicted else 0.0,
                # an upper bound on the hit rate they cost (a wrong victim is a lost block hit
                # at most; less when its chain was cut before it anyway)
                "wrong_hit_rate": self.wrong * self.block_size / self.prompt_tokens if self.prompt_tokens else 0.0,
                "causes": dict(self.causes.most_common()), "oracle_would_take": dict(self.instead.most_common()),
                "read_next_by": dict(self.next_reader),
                "tool_gap_actual_over_predicted_median": median(r) if r else None,
                "tool_gap_back_before_half_predicted": sum(x < 0.5 for x in r) / len(r) if r else None}


def _state(engine: OfflineEngine, key: str, now: float) -> str:
    reg = engine.sessions
    s = reg.sessions[key]
    pol = engine.policy
    if s.prefetched_until > now or s.protect_until > now:
        label = "prefetched"
    elif s.state is SessionState.ACTIVE:
        label = "in flight"
    elif any(c in reg.sessions and reg.sessions[c].state is not SessionState.ENDED for c in s.children):
        label = "leader waiting on sub-agents"
    elif s.state is SessionState.SUSPENDED:
        label = "suspended"
    elif hasattr(pol, "next_use") and pol.next_use(s, now) is None:
        label = "presumed gone"
    else:
        label = "waiting on a tool"
    return label + (" (sub-agent)" if s.parent is not None else "")


class _Auditor:
    def __init__(self, accesses, block_size: int) -> None:
        self.reads: dict[bytes, list[int]] = defaultdict(list)
        for i, a in enumerate(accesses):
            for h in a.prompt:
                self.reads[h].append(i)
        self.times = [a.admitted_s for a in accesses]
        self.readers = [a.session_id for a in accesses]
        self.audit = EvictionAudit()
        self.engine: OfflineEngine | None = None

    def next_read(self, h: bytes, i: int) -> float:
        r = self.reads.get(h)
        if not r:
            return NEVER
        j = bisect.bisect_left(r, i)
        return r[j] if j < len(r) else NEVER

    def attach(self, engine: OfflineEngine) -> None:
        self.engine = engine
        chained = engine.kv.pool.on_evict

        def hook(victims) -> None:
            self.on_evict(victims)
            if chained is not None:
                chained(victims)
        engine.kv.pool.on_evict = hook

    def _top_holder(self, h: bytes) -> str | None:
        e = self.engine
        holders = e.sessions.holders.get(h)
        if not holders:
            return None
        return max(holders, key=lambda k: e.kv.ranking.session_class(k) or 0)

    def on_evict(self, victims) -> None:
        e = self.engine
        i, now = len(e.result.accesses), e.loop.now  # the request being admitted reads at index i
        pool = e.kv.pool
        cands = pool.cached_free_blocks()
        k = len(victims)
        self.audit.evicted += k
        scored = sorted(((self.next_read(b.hash, i), b) for b in cands), key=lambda t: -t[0])
        threshold = scored[k - 1][0] if len(scored) >= k else NEVER
        taken = {b.block_id for b in victims}
        # the oracle's picks the policy left resident, nearest-read first: each pairs with one
        # wrong victim (the oracle kept the victim and took that block instead)
        spared = sorted(((nxt, b) for nxt, b in scored[:k] if b.block_id not in taken), key=lambda t: t[0])
        wrong = sorted(((self.next_read(v.hash, i), v) for v in victims), key=lambda t: t[0])
        wrong = [(nxt, v) for nxt, v in wrong if nxt != NEVER and nxt < threshold]
        for (nxt, v), (_, pick) in zip(wrong, spared):
            self.audit.wrong += 1
            mine = self._top_holder(v.hash)
            pick_holder = self._top_holder(pick.hash)
            self.audit.instead[_state(e, pick_holder, now) if pick_holder else "unheld"] += 1
            if mine is None:
                self.audit.causes["unheld, read again"] += 1
                continue
            holders = e.sessions.holders.get(v.hash, set())
            if e.sessions.holders.get(pick.hash, set()) & holders:
                self.audit.causes["order inside a session"] += 1
                continue
            state = _state(e, mine, now)
            own = any(e.sessions.sessions[k].session_id == self.readers[nxt] for k in holders)
            self.audit.next_reader["a holder" if own else "another session"] += 1
            lower = pool.class_of(v) < pool.class_of(pick)
            self.audit.causes[("ranked lower: " if lower else "same class: ") + state] += 1
            s = e.sessions.sessions[mine]
            if state.startswith(("waiting on a tool", "suspended")) and hasattr(e.policy, "next_use"):
                predicted = e.policy.next_use(s, now)
                actual = self.times[nxt] - now
                if predicted is not None and predicted > 0 and math.isfinite(predicted):
                    self.audit.gap_ratio.append(actual / predicted)


def audit_evictions(workload: Workload, cfg: OfflineConfig, memo: dict | None = None) -> EvictionAudit:
    """Replay `workload` under `cfg` twice (see the module doc) and attribute every wrong victim."""
    memo = memo if memo is not None else {}
    first = replay_offline(workload, cfg, memo)
    auditor = _Auditor(first.accesses, cfg.block_size)
    second = replay_offline(workload, cfg, memo, observe=auditor.attach)
    if second.hit_rate != first.hit_rate:
        raise RuntimeError("the audited replay diverged from the first pass: the audit changed state")
    auditor.audit.hit_rate = second.hit_rate
    auditor.audit.prompt_tokens = second.prompt_tokens
    auditor.audit.block_size = cfg.block_size
    return auditor.audit
