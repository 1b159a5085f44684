"""Admission policies (`hintkv.engine.admission`) in the real scheduler, no model: made-up runner
output as in test_scheduler.py. fcfs is vLLM's order; cache-aware prefers resident prefixes,
reserves room to the end (no preemption), and bounds how often anyone is overtaken."""

import pytest

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.config import EngineConfig
from hintkv.engine.admission import admission_names, make_admission
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from tests.engine.test_scheduler import drive, make_seq


def run_all(sched, kv, limit=500):
    done = []
    for _ in range(limit):
        if not sched.has_work():
            return done
        drive(sched, kv, done)
    raise AssertionError("did not finish")


def admission_order(sched, kv, limit=500):
    """Run to the end; the request ids in the order they were first scheduled."""
    order = []
    for _ in range(limit):
        if not sched.has_work():
            return order
        out = sched.schedule()
        order += [s.seq.request_id for s in out.scheduled if s.seq.request_id not in order]
        sched.update_from_output(out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
        sched.check_integrity()
    raise AssertionError("did not finish")


def test_registry_and_config():
    assert {"fcfs", "cache-aware"} <= set(admission_names())
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        make_admission("nope")
    with pytest.raises(ValueError, match="scheduling_policy"):
        EngineConfig(scheduling_policy="nope")


@pytest.mark.parametrize(("policy", "first"), [("fcfs", "x"), ("cache-aware", "b")])
def test_resident_prefix_goes_first(policy, first):
    kv = KVCacheManager(32, 4, make_policy("lru"))
    sched = Scheduler(kv, max_num_seqs=1, max_num_batched_tokens=64, admission=policy)
    sched.add_request(make_seq("a", list(range(12)), 1))
    run_all(sched, kv)
    sched.add_request(make_seq("x", list(range(100, 112)), 1))  # arrived first, nothing resident
    sched.add_request(make_seq("b", [*range(12), 50, 51], 1))  # 8 tokens of a's prefix resident
    assert admission_order(sched, kv)[0] == first


def test_cache_aware_never_preempts_and_finishes_everyone():
    # the pool holds 24 tokens; three 7-token prompts growing by 6 do not fit at once
    for policy, preempts in (("fcfs", True), ("cache-aware", False)):
        kv = KVCacheManager(6, 4, make_policy("lru"))
        sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, admission=policy)
        for i in range(3):
            sched.add_request(make_seq(f"s{i}", [i * 10 + j for j in range(7)], max_tokens=6))
        done = run_all(sched, kv)
        assert len(done) == 3 and all(s.num_output_tokens == 6 for s in done)
        assert (sched.num_preemptions > 0) == preempts, policy
        assert kv.pool.num_free == kv.pool.num_blocks


def test_cache_aware_keeps_a_waiting_prefix_resident():
    """A request that does not fit yet keeps its resident prefix: the smaller ones admitted past
    it take other room, so it still hits when it runs."""
    kv = KVCacheManager(12, 4, make_policy("lru"))
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=256, admission="cache-aware")
    sched.add_request(make_seq("a", list(range(16)), 1))
    run_all(sched, kv)  # a's 4 blocks cached (ref 0)
    hog = make_seq("hog", list(range(200, 216)), 12)  # 7 blocks to the end: runs for a while
    sched.add_request(hog)
    drive(sched, kv, [])
    big = make_seq("big", [*range(16), *range(300, 320)], 4)  # a's prefix + 20 more: 10 blocks
    sched.add_request(big)
    for i in range(3):
        sched.add_request(make_seq(f"s{i}", list(range(400 + 10 * i, 404 + 10 * i)), 1))  # 2 blocks each
    run_all(sched, kv)
    assert big.num_cached_tokens == 16


def test_starving_request_is_not_overtaken_forever():
    kv = KVCacheManager(10, 4, make_policy("lru"))
    policy = make_admission("cache-aware", max_skips=2)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=256, admission=policy)
    sched.add_request(make_seq("hog", list(range(500, 516)), 8))  # 6 blocks to the end
    drive(sched, kv, [])
    sched.add_request(make_seq("big", list(range(600, 620)), 4))  # 6 blocks: waits for hog
    for i in range(6):
        sched.add_request(make_seq(f"s{i}", list(range(700 + 10 * i, 703 + 10 * i)), 4))  # 2 blocks
    order = [r for r in admission_order(sched, kv) if r != "hog"]
    assert order.index("big") == 2, order  # overtaken max_skips times, then nothing passes it
    assert sorted(order) == sorted(["big", *(f"s{i}" for i in range(6))])
    sched.check_integrity()
    assert policy.skips == {}


@pytest.mark.parametrize(("eviction", "hits"), [("lru", False), ("qlru", True)])
def test_qlru_protects_queued_prompts_in_the_engine(eviction, hits):
    """qlru with hints off: the scheduler holds each queued prompt as a transient session, so a
    request running ahead of it evicts other cached blocks first (lru evicts the oldest)."""
    cfg = EngineConfig(eviction_policy=eviction, hints=False, block_size=4, max_num_seqs=1,
                       max_num_batched_tokens=256)
    sched = Scheduler.from_config(cfg, 12)
    kv = sched.kv
    sched.add_request(make_seq("a", list(range(16)), 1))
    run_all(sched, kv)
    sched.add_request(make_seq("c", list(range(100, 116)), 1))
    run_all(sched, kv)  # cached: a's 4 blocks (older), c's 4 blocks (newer)
    sched.add_request(make_seq("big", list(range(200, 232)), 1))  # 8+1 blocks: evicts 5 of the 8
    a2 = make_seq("a2", [*range(16), 60, 61], 1)
    sched.add_request(a2)  # queued behind big (one sequence at a time)
    run_all(sched, kv)
    assert (a2.num_cached_tokens == 16) == hits, a2.num_cached_tokens
    sched.check_integrity()


@pytest.mark.parametrize(("below", "first"), [(False, "x"), (True, "b")])
def test_short_first_counts_a_run_held_below_as_computed(below, first):
    """A waiting prompt whose leading blocks a lower tier holds (`held_below`: the tier
    connector's loadable run in the engine, the host's bookkeeping offline) is as short as its
    cold tail: it goes before a shorter prompt that has nothing anywhere."""
    kv = KVCacheManager(64, 4, make_policy("lru"))
    sched = Scheduler(kv, max_num_seqs=1, max_num_batched_tokens=64, admission="short-first")
    lower = set()
    b = make_seq("b", list(range(200, 240)), 1)  # 40 tokens: 9 full blocks before the last token
    if below:
        lower.update(kv.update_hashes(b, b.num_tokens - 1)[:9])
    sched.admission.held_below = lambda hashes: next((i for i, h in enumerate(hashes) if h not in lower), len(hashes))
    sched.add_request(make_seq("x", list(range(100, 112)), 1))  # 12 cold tokens, arrived first
    sched.add_request(b)
    assert admission_order(sched, kv)[0] == first
