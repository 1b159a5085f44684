"""The one-pass batch operations (`append_many`, `commit_many`, a pool's run filing) do exactly
what one call per sequence / per block does: same block tables, victims, write-down order,
prefix index and victim order, under both policies."""

from __future__ import annotations

import random

import pytest

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.types import SessionRef
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams

BS = 4
ROOT = namespace_root("test", "float32", BS, None)
SAMPLING = SamplingParams(temperature=0, max_tokens=1 << 20)


class World:
    def __init__(self, policy: str, num_blocks: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sessions = SessionRegistry(protect_budget_blocks=num_blocks // 4)
        self.kv = KVCacheManager(num_blocks, BS, make_policy(policy, sessions=self.sessions))
        self.sam = SessionAwareManager(self.kv, self.sessions, clock=lambda: 0.0)
        self.evicted: list[bytes] = []
        self.kv.pool.on_evict = lambda victims: self.evicted.extend(b.hash for b in victims)
        self.n = 0

    def cache_sessions(self, count: int, blocks: int) -> None:
        """Sessions that ran and now wait holding their context (cached on the device)."""
        for i in range(count):
            tokens = [self.rng.randrange(1, 999) for _ in range(blocks * BS)]
            s = self.seq(tokens)
            self.kv.admit(s, self.kv.match_prefix(s), s.num_tokens)
            s.num_computed_tokens = s.num_tokens
            self.kv.commit(s)
            key = self.sam.on_arrival(SessionRef("t", f"s{i}", f"s{i}"))
            self.kv.free(s)
            self.sam.on_done(key, hash_blocks(ROOT, tokens, BS))

    def seq(self, tokens: list[int]) -> Sequence:
        self.n += 1
        return Sequence(f"r{self.n}", list(tokens), len(tokens), SAMPLING, ROOT)

    def state(self, running: list[Sequence]) -> tuple:
        pool = self.kv.pool
        return ([[b.block_id for b in s.block_table] for s in running],
                [s.num_registered_blocks for s in running], list(self.evicted),
                [b.block_id for b in pool.cached_free_blocks()], pool.num_evicted,
                sorted((b.block_id, h) for h, b in pool._index.items()))


@pytest.mark.parametrize("policy", ["lru", "sam"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_append_and_commit_match_one_call_per_sequence(policy, seed):
    one, many = World(policy, 48, seed), World(policy, 48, seed)
    runs = {}
    for w in (one, many):
        w.cache_sessions(6, 5)  # 30 of 48 blocks cached: decoding evicts them
        running = []
        for _ in range(6):
            s = w.seq([w.rng.randrange(1, 999) for _ in range(w.rng.randrange(1, 3 * BS))])
            w.kv.admit(s, w.kv.match_prefix(s), s.num_tokens)
            s.num_computed_tokens = s.num_tokens
            w.kv.commit(s)
            running.append(s)
        runs[id(w)] = running
    served_log = []
    for step in range(40):
        states = []
        for w in (one, many):
            running = runs[id(w)]
            for s in running:
                s.token_ids.append(7 + step)
            if w is one:
                served = len(running)
                for i, s in enumerate(running):
                    if not w.kv.can_append(s, 1):
                        served = i
                        break
                    w.kv.append(s, 1)
            else:
                served = w.kv.append_many(running, 1)
            served_log.append(served)
            for s in running[:served]:
                s.num_computed_tokens += 1
            if w is one:
                for s in running:
                    w.kv.commit(s)
            else:
                w.kv.commit_many(running)
            w.kv.check_integrity()
            states.append(w.state(running))
        assert states[0] == states[1], f"step {step}"
        assert served_log[-1] == served_log[-2]
    assert one.evicted, "decoding never evicted: the comparison saw no allocation from the cache"
    assert min(served_log) < len(runs[id(one)]), "the pool never ran out: no partial batch seen"
    for w in (one, many):
        for s in runs[id(w)]:
            w.kv.free(s)  # a run of blocks per group, filed at once
    assert one.state([]) == many.state([])
    one.kv.check_integrity()
    many.kv.check_integrity()
