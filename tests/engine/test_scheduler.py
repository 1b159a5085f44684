"""Scheduler + KV manager under a random workload: admit, grow, finish, cancel, preempt.

The model is not needed to test the bookkeeping: each step's runner output is made up (token 7
for every sequence that samples) and handed to `update_from_output`, as the engine hands the
real runner's.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.hashing import namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import RequestOutput, SamplingParams

ROOT = namespace_root("test", "float32", 4, None)


def make_seq(rid: str, prompt: list[int], max_tokens: int = 4) -> Sequence:
    return Sequence(rid, list(prompt), len(prompt), SamplingParams(temperature=0, max_tokens=max_tokens), ROOT)


def drive(sched: Scheduler, kv: KVCacheManager, done: list[Sequence]) -> list[RequestOutput]:
    out = sched.schedule()
    seqs = {s.seq.request_id: s.seq for s in out.scheduled} | {s.request_id: s for s in out.out_of_room}
    outputs = sched.update_from_output(
        out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
    done.extend(seqs[o.request_id] for o in outputs if o.finished)
    running_blocks = sum(len(s.block_table) for s in sched.running)
    assert kv.pool.num_in_use <= running_blocks
    sched.check_integrity()
    return outputs


def test_prefix_hit_caps_at_prompt_minus_one_and_counts():
    kv = KVCacheManager(16, 4, make_policy("lru"))
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    done: list = []
    sched.add_request(make_seq("a", list(range(12)), 1))
    while sched.has_work():
        drive(sched, kv, done)
    b = make_seq("b", list(range(12)), 1)  # identical, block-aligned prompt
    sched.add_request(b)
    drive(sched, kv, done)
    assert b.num_cached_tokens == 8, "the last block must be recomputed for logits"
    c = make_seq("c", list(range(13)), 1)
    sched.add_request(c)
    drive(sched, kv, done)
    assert c.num_cached_tokens == 12
    assert kv.prefix_hit_tokens == 20 and kv.prefix_query_tokens == 12 + 12 + 13


def test_chunked_prefill_respects_budget():
    kv = KVCacheManager(64, 4, make_policy("lru"))
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=10)
    sched.add_request(make_seq("a", list(range(25))))
    sched.add_request(make_seq("b", list(range(100, 103))))
    out = sched.schedule()
    assert out.num_batched_tokens == 10 and [s.num_new_tokens for s in out.scheduled] == [10]


def test_preemption_instead_of_failure():
    kv = KVCacheManager(6, 4, make_policy("lru"))  # 24 tokens
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    seqs = [make_seq(f"s{i}", [i * 10 + j for j in range(7)], max_tokens=6) for i in range(3)]
    for s in seqs:
        sched.add_request(s)
    done: list = []
    for _ in range(200):
        if not sched.has_work():
            break
        drive(sched, kv, done)
    assert len(done) == 3 and sched.num_preemptions > 0
    assert all(s.num_output_tokens == 6 for s in done)
    assert kv.pool.num_free == kv.pool.num_blocks


def test_prompt_bigger_than_pool_finishes_instead_of_looping():
    kv = KVCacheManager(2, 4, make_policy("lru"))
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    s = make_seq("big", list(range(7)), max_tokens=8)  # fits at first, outgrows the pool
    sched.add_request(s)
    done: list = []
    for _ in range(50):
        if not sched.has_work():
            break
        drive(sched, kv, done)
    assert done == [s] and kv.pool.num_free == 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "step", "step", "cancel"]),
                          st.integers(0, 5), st.integers(1, 30)), max_size=60))
def test_random_workload_keeps_integrity_and_returns_every_block(ops):
    kv = KVCacheManager(12, 4, make_policy("lru"))
    sched = Scheduler(kv, max_num_seqs=3, max_num_batched_tokens=16)
    done: list = []
    live: list[Sequence] = []
    for i, (op, a, b) in enumerate(ops):
        if op == "add":
            prefix = [1, 2, 3, 4, 5, 6, 7, 8][: a + 2]  # shared prefixes exercise the cache
            live.append(make_seq(f"r{i}", prefix + [100 + i] * (b % 12), max_tokens=a + 1))
            sched.add_request(live[-1])
        elif op == "cancel" and live:
            victim = live.pop(a % len(live))
            assert (sched.abort_request(victim.request_id) is not None) == (victim not in done)
        elif sched.has_work():
            drive(sched, kv, done)
        kv.check_integrity()
    for _ in range(500):
        if not sched.has_work():
            break
        drive(sched, kv, done)
    assert not sched.has_work()
    assert kv.pool.num_free == kv.pool.num_blocks
    kv.check_integrity()
