"""A waiting request's kept device run (`KVCacheManager.device_run`, `match_prefix(keep=True)`)
is always what a fresh `leading_run` finds, through random churn: other sequences admitted,
computed, committed and freed (registering blocks, evicting cached ones), drops, and the pool's
unindex log wrapping (its epoch bumps); it is dropped on admit and free."""

from __future__ import annotations

import random

import pytest

from hintkv.cache import block_pool
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


def _run_to_end(kv: KVCacheManager, s: Sequence) -> None:
    m = kv.match_prefix(s)
    if not kv.can_admit(s, m, s.num_tokens - m.num_tokens):
        return
    kv.admit(s, m, s.num_tokens - m.num_tokens)
    s.num_computed_tokens = s.num_tokens
    kv.commit(s)
    kv.free(s)


@pytest.mark.parametrize("policy", ["lru", "sam"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kept_run_equals_a_fresh_match(policy: str, seed: int, monkeypatch) -> None:
    monkeypatch.setattr(block_pool, "UNINDEX_LOG_MAX", 64)  # the log wraps during the test
    rng = random.Random(seed)
    kv = KVCacheManager(48, BS, make_policy(policy, sessions=SessionRegistry()))
    shared = [rng.randrange(1, 50) for _ in range(6 * BS)]
    waiting = [_seq(f"w{i}", shared[:rng.randrange(2, 6) * BS] + [rng.randrange(1, 50) for _ in range(8 * BS)])
               for i in range(4)]
    epochs = set()
    for step in range(300):
        for w in waiting:  # every waiting request is matched each step, kept between steps
            kept = kv.match_prefix(w, keep=True)
            fresh = kv.pool.leading_run(kv.update_hashes(w, w.num_tokens - 1))
            assert [b.block_id for b in kept.blocks] == [b.block_id for b in fresh]
            assert kept.num_tokens == len(fresh) * BS
        op = rng.random()
        if op < 0.6:  # another request runs: registers its blocks, may evict cached ones
            cut = rng.randrange(0, 5 * BS)
            pool = shared if rng.random() < 0.5 else waiting[rng.randrange(4)].token_ids
            tokens = pool[:cut] + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 6) * BS)]
            _run_to_end(kv, _seq(f"o{step}", tokens))
        elif op < 0.8:  # a cached block is dropped (an evict hint)
            cached = kv.pool.cached_free_blocks()
            if cached:
                kv.pool.drop(rng.choice(cached))
        else:  # a waiting request's own prefix is computed by a twin (the run grows at its end)
            w = waiting[rng.randrange(4)]
            _run_to_end(kv, _seq(f"t{step}", w.token_ids[:rng.randrange(1, 10) * BS + 1]))
        epochs.add(kv.pool.unindex_epoch)
    assert len(epochs) > 1, "the unindex log never wrapped: the epoch path went untested"
    for w in waiting:  # admitted or freed: nothing kept
        kv.free(w)
    assert not kv._runs
    kv.check_integrity()
