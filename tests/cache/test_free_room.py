"""`KVCacheManager.free_room` counts a match's unreferenced blocks once while no block's reference
count changed (`BlockPool.ref_epoch`), and the count it keeps is always the one a fresh pass
gives: a match asked again after others touch, release, allocate or evict its blocks."""

from __future__ import annotations

import random
from operator import attrgetter

import pytest

from hintkv.cache.hashing import namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sessions import SessionRegistry
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams

BS = 4
ROOT = namespace_root("test", "float32", BS, None)
SAMPLING = SamplingParams(temperature=0, max_tokens=1 << 20)


def _seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, list(tokens), len(tokens), SAMPLING, ROOT)


def _fresh(kv: KVCacheManager, match) -> int:
    return kv.pool.num_free - list(map(attrgetter("ref_cnt"), match.blocks)).count(0)


@pytest.mark.parametrize("policy", ["lru", "sam"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kept_count_equals_a_fresh_pass_through_churn(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    kv = KVCacheManager(40, BS, make_policy(policy, sessions=SessionRegistry()))
    shared = [rng.randrange(1, 50) for _ in range(6 * BS)]
    running: list[Sequence] = []
    matches = []  # (request, match) kept across the churn, asked again each step
    asked = stale = 0
    for step in range(300):
        s = _seq(f"s{step}", shared[:rng.randrange(1, 7) * BS] + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 4) * BS)])
        m = kv.match_prefix(s)
        matches.append(m)
        n = s.num_tokens - m.num_tokens
        if rng.random() < 0.7 and kv.can_admit(s, m, n):
            kv.admit(s, m, n)
            s.num_computed_tokens = s.num_tokens
            kv.commit(s)
            running.append(s)
        if running and rng.random() < 0.5:
            kv.free(running.pop(rng.randrange(len(running))))
        grown = []  # blocks taken straight from the pool (a decode's growth: victims evicted)
        for old in matches[-6:]:
            before = old.unreferenced
            assert kv.free_room(old) == _fresh(kv, old)
            assert kv.free_room(old) == _fresh(kv, old)  # asked twice: counted once
            asked += 1
            stale += before[0] != -1 and before[0] != kv.pool.ref_epoch
            if kv.pool.num_free and rng.random() < 0.3:
                grown += kv.pool.allocate(rng.randrange(1, kv.pool.num_free + 1))
                for m in matches[-6:]:
                    assert kv.free_room(m) == _fresh(kv, m)
        kv.pool.release(grown)
        kv.pool.check_integrity()
    assert stale > 50  # kept counts went stale and were counted again


def test_counts_once_while_no_reference_changes() -> None:
    kv = KVCacheManager(16, BS, make_policy("lru"))
    a = _seq("a", list(range(1, 4 * BS + 2)))
    m = kv.match_prefix(a)
    kv.admit(a, m, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    kv.commit(a)
    kv.free(a)  # 4 full blocks cached, unreferenced
    b = _seq("b", list(range(1, 4 * BS + 2)))
    mb = kv.match_prefix(b)
    assert len(mb.blocks) == 4 and kv.free_room(mb) == 16 - 4
    epoch = kv.pool.ref_epoch
    mb.blocks[0].ref_cnt = 1  # behind the pool's back: a kept count does not see it
    assert kv.free_room(mb) == 16 - 4
    mb.blocks[0].ref_cnt = 0
    kv.pool.touch(mb.blocks[:2])  # through the pool: counted again
    assert kv.pool.ref_epoch != epoch and kv.free_room(mb) == (16 - 2) - 2
