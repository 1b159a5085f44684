"""`bench cache`'s worlds: one engine's cache core filled to a steady state, its single-call
operations (`ops_once`) and its scheduler steps (`StepLoop`), each part timed. No model: what is
measured is bookkeeping. `hintkv.bench.cache` builds the worlds, measures them interleaved and
prints the tables and goals.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.cache.types import SessionRef
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack

BS = 16
SYSTEM_BLOCKS = 64  # shared by every session
OWN_BLOCKS = 64  # each session's own context
RUNNING = 256
HOST_FACTOR = 10
# gaps of history replayed per session: the gap estimate is an EWMA with alpha 0.3, so older gaps
# weigh < 0.7**16 (0.3%): more would change nothing but the setup time
HISTORY = 16
ROOT = namespace_root("bench-cache", "float16", BS, None)
PARTS = ["sam", "poll", "land", "append", "finish", "resume", "commit"]  # of one step
OPS = ["match", "admit", "append", "commit", "free", "arrive", "done", "victims", "tier_put",
       "tier_lookup"]
SAMPLING = SamplingParams(temperature=0, max_tokens=1 << 30)


class World:
    """The cache core of one engine, filled to a steady state (device full of cached blocks)."""

    def __init__(self, policy: str, device_tokens: int, num_sessions: int, seed: int,
                 gaps: list[list[float]]) -> None:
        self.rng = random.Random(seed)
        self.num_blocks = device_tokens // BS
        self._fixed: float | None = 0.0  # the world's clock: fixed while histories are replayed,
        self._base = self._wall = 0.0  # then running at wall speed from where they ended
        self.sessions = SessionRegistry(protect_budget_blocks=self.num_blocks // 10)
        self.kv = KVCacheManager(self.num_blocks, BS, make_policy(policy, sessions=self.sessions))
        self.sam = SessionAwareManager(self.kv, self.sessions, clock=self.clock)
        kv_cache = torch.zeros(2, self.num_blocks, BS, 1, 1, dtype=torch.float16)
        self.io = DeviceBlockIO([kv_cache])
        host = HostTier(self.io.layout, HOST_FACTOR * self.num_blocks * self.io.layout.nbytes)
        self.stack = TierStack([host])
        self.kv.tiers = TierConnector(self.kv.pool, BS, self.stack, self.io, self.kv.ranking,
                                      hints=True, clock=self.clock)
        self.payload = torch.zeros(self.io.layout.shape, dtype=self.io.layout.dtype)
        self._n = 0
        system = self._tokens(SYSTEM_BLOCKS * BS)
        self.contexts: list[list[int]] = []  # per session: system prompt + its own context
        self.hashes: list[list[bytes]] = []
        self.gaps: list[list[float]] = []  # per session: its agent's recorded gaps, in order
        self.next_gap: list[int] = []  # per session: index of its next gap
        self.due: list[tuple[float, int]] = []  # (recorded next arrival, session): a heap
        # only the latest contexts can still be resident (device + host); older ones were
        # evicted long ago and are only held in the registry (placing them would only churn)
        resident_from = num_sessions - (HOST_FACTOR + 1) * self.num_blocks // OWN_BLOCKS - 1
        start = 1e6
        for i in range(num_sessions):
            tokens = system + self._tokens(OWN_BLOCKS * BS)
            self.contexts.append(tokens)
            self.hashes.append(hash_blocks(ROOT, tokens, BS))
            seq = gaps[i % len(gaps)]
            cut = self.rng.randrange(1, len(seq)) if len(seq) > 1 else 0
            self.gaps.append(seq)
            self.next_gap.append(cut)
            # its history: the recorded gaps before the cut, the last call ending at a random
            # point of the gap at the cut before "now" (`start`)
            last_done = start - self.rng.random() * seq[cut]
            history = seq[max(0, cut - HISTORY):cut]
            t = last_done - sum(history)
            for g in [*history, None]:
                self._fixed = t
                key = self.sam.on_arrival(self._ref(i))
                if g is None and i >= resident_from:
                    self._place(self.hashes[i])
                self.sam.on_done(key, self.hashes[i])
                if g is not None:
                    t += g
            heapq.heappush(self.due, (last_done + seq[cut], i))
            if i % 16 == 15:
                self._settle()
        self._fixed = start
        self.sam.catch_up(start)  # the predicted returns the histories left behind
        self.kv.ranking.tick(start, self.sessions.sessions)  # and their re-ranks, all of them
        self._settle()
        self.stack.flush()
        self._fixed = start  # paused until measured

    @contextmanager
    def running(self) -> Iterator[None]:
        """The world's clock runs at wall speed inside, and stands still outside (other worlds
        are measured meanwhile)."""
        self._base, self._wall, self._fixed = self._fixed, time.monotonic(), None
        try:
            yield
        finally:
            self._fixed = self.clock()

    def clock(self) -> float:
        if self._fixed is not None:
            return self._fixed
        return self._base + time.monotonic() - self._wall

    def next_resume(self) -> int:
        """The session whose recorded next call comes first (then its next gap is due)."""
        _, i = heapq.heappop(self.due)
        seq = self.gaps[i]
        self.next_gap[i] = (self.next_gap[i] + 1) % len(seq)
        heapq.heappush(self.due, (self.clock() + seq[self.next_gap[i]], i))
        return i

    def _ref(self, i: int) -> SessionRef:
        return SessionRef("bench", f"s{i}", f"s{i}")

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(1, 49_000) for _ in range(n)]

    def _place(self, hashes: list[bytes]) -> None:
        """The context's KV lands on the device as cached blocks (older ones get evicted)."""
        todo = [h for h in hashes if self.kv.pool.lookup(h) is None]
        todo = todo[:self.num_blocks]
        blocks = self.kv.pool.allocate(len(todo))
        for b, h in zip(blocks, todo):
            self.kv.pool.register(b, h)
        self.kv.pool.release(blocks)

    def _settle(self) -> None:
        self.kv.tiers.poll()
        self.kv.flush_write_downs()

    def seq(self, tokens: list[int], hashes: list[bytes] | None = None) -> Sequence:
        self._n += 1
        s = Sequence(f"r{self._n}", list(tokens), len(tokens), SAMPLING, ROOT)
        if hashes is not None:
            s.block_hashes = list(hashes)
        return s

    def fresh_seq(self, num_blocks: int) -> Sequence:
        tokens = self._tokens(num_blocks * BS)
        return self.seq(tokens, hash_blocks(ROOT, tokens, BS))

    @property
    def host_fill(self) -> float:
        u = self.stack.usage()["host"]
        return u.num_blocks / max(1, u.capacity_blocks)


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3  # microseconds


def ops_once(w: World, out: dict[str, list[float]]) -> None:
    """One sample of every operation (single calls, each timed on its own) into `out`."""
    kv, pool = w.kv, w.kv.pool
    w.stack.flush()  # no backlog of copies competing for the GIL while one call is timed
    i = w.rng.randrange(len(w.contexts))
    # match: a resumed session's context + one new token
    s = w.seq(w.contexts[i] + [7], w.hashes[i])
    out["match"].append(_time(lambda s=s: kv.match_prefix(s)))
    # admit a 4-block prompt into the full pool, then compute, finish and free it
    s = w.fresh_seq(4)
    m = kv.match_prefix(s)

    def admit(s=s, m=m) -> None:
        if kv.can_admit(s, m, s.num_tokens):
            kv.admit(s, m, s.num_tokens)
    out["admit"].append(_time(admit))
    w.kv.flush_write_downs()
    if s.block_table:  # admitted: a pool held by running/protected blocks may refuse it
        s.num_computed_tokens = s.num_tokens - 1
        kv.commit(s)
        for _ in range(3):  # decode tokens
            s.token_ids.append(5)

            def append(s=s) -> None:
                if kv.can_append(s, 1):
                    kv.append(s, 1)
            out["append"].append(_time(append))
            s.num_computed_tokens += 1
            out["commit"].append(_time(lambda s=s: kv.commit(s)))
    kv.free(s)
    # free a finished 2K-token sequence (its session's context, admitted from the device)
    s = w.seq(w.contexts[i] + [9], w.hashes[i])
    m = kv.match_prefix(s)
    if not m.lower and kv.can_admit(s, m, s.num_tokens - m.num_tokens):
        kv.admit(s, m, s.num_tokens - m.num_tokens)
        s.num_computed_tokens = s.num_tokens
        kv.commit(s)
        w.kv.flush_write_downs()
        out["free"].append(_time(lambda s=s: kv.free(s)))
    # a session's state changes (its held blocks change class)
    keys: list[str] = []
    ref = w._ref(i)
    out["arrive"].append(_time(lambda r=ref, ks=keys: ks.append(w.sam.on_arrival(r))))
    out["done"].append(_time(lambda k=keys[0], hs=w.hashes[i]: w.sam.on_done(k, hs)))
    out["victims"].append(_time(lambda: pool.choose_victims(16)))
    h = w.rng.randbytes(16)
    w.stack.flush()  # the write-downs above are not competing for the GIL either
    out["tier_put"].append(_time(lambda h=h: w.stack.store([(h, w.payload)])))
    out["tier_lookup"].append(_time(lambda hs=w.hashes[i]: w.stack.lookup(hs)))
    w.kv.tiers.poll()
