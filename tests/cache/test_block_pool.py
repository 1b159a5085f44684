"""Block pool and KV manager bookkeeping on the CPU, no model: invariants under random cycles."""

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.block_pool import BlockPool
from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.policies import make_policy, policy_names


def test_allocate_release_register_and_reuse_in_lru_order():
    pool = BlockPool(4, make_policy("lru"))
    a, b = pool.allocate(2)
    assert pool.register(a, b"h-a") and pool.register(b, b"h-b")
    assert not pool.register(pool.allocate(1)[0], b"h-a"), "duplicate hash must stay private"
    pool.release([a])
    pool.release([b])  # a released first -> least recently used
    pool.check_integrity()
    assert pool.num_cached_free == 2 and pool.lookup(b"h-a") is a
    got = pool.allocate(2)  # one empty block, then the LRU cached block (a)
    assert a in got and pool.lookup(b"h-a") is None and pool.lookup(b"h-b") is b
    pool.check_integrity()


def test_drop_frees_a_cached_block_at_once():
    pool = BlockPool(2, make_policy("lru"))
    (a,) = pool.allocate(1)
    pool.register(a, b"x")
    assert not pool.drop(a), "in-use blocks cannot be dropped"
    pool.release([a])
    assert pool.drop(a) and pool.lookup(b"x") is None and pool.num_cached_free == 0
    pool.check_integrity()


def test_choose_victims_changes_nothing():
    for name in policy_names():
        pool = BlockPool(6, make_policy(name))
        blocks = pool.allocate(6)
        for i, blk in enumerate(blocks):
            pool.register(blk, bytes([i]))
        pool.release(blocks)
        before = [(b.block_id, b.ref_cnt, b.hash) for b in pool.blocks]
        order = pool.cached_free_blocks()
        victims = pool.choose_victims(3)
        assert len(victims) == 3
        assert before == [(b.block_id, b.ref_cnt, b.hash) for b in pool.blocks]
        assert pool.cached_free_blocks() == order
        pool.check_integrity()


def test_hash_chain_depends_on_namespace_and_prefix():
    r1, r2 = namespace_root("m", "float32", 4, None), namespace_root("m", "float32", 4, "salt")
    toks = list(range(12))
    h1, h2 = hash_blocks(r1, toks, 4), hash_blocks(r2, toks, 4)
    assert len(h1) == 3 and not set(h1) & set(h2)
    other = hash_blocks(r1, [99] + toks[1:], 4)
    assert all(x != y for x, y in zip(h1, other)), "a change in block 0 changes every later hash"
    assert hash_blocks(r1, toks, 4, start=1, parent=h1[0]) == h1[1:]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "reg", "rel", "drop"]), st.integers(0, 7)),
                max_size=80))
def test_random_cycles_keep_integrity(ops):
    pool = BlockPool(8, make_policy("lru"))
    held: list = []
    n_hash = 0
    for op, k in ops:
        if op == "alloc" and pool.can_allocate(k % 3 + 1):
            held.extend(pool.allocate(k % 3 + 1))
        elif op == "reg" and held:
            b = held[k % len(held)]
            if b.hash is None:
                n_hash += 1
                pool.register(b, n_hash.to_bytes(4, "big"))
        elif op == "rel" and held:
            pool.release([held.pop(k % len(held))])
        elif op == "drop":
            cached = pool.cached_free_blocks()
            if cached:
                pool.drop(cached[k % len(cached)])
        pool.check_integrity()
    pool.release(held)
    pool.check_integrity()
    assert pool.num_free == pool.num_blocks
