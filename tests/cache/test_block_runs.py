"""`BlockRuns` (the device pool's victim order by runs) against `ClassedLRU` (one entry per block,
the simple reference): after any sequence of filings (runs, single blocks at the back or the
front), removals (single, many, victims taken from the front by `first`), node moves and partial reads of
the victim order, both give the same order, counts and classes. A move may hand the ranking's
group, which caches its node (`Group.node`): a stale cache (the node emptied, then another one
filed under the same id) must never be moved."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.block import Block
from hintkv.cache.block_runs import BlockRuns
from hintkv.cache.group_walk import Group
from hintkv.tiers.order import ClassedLRU

NUM_BLOCKS = 24
GROUPS = [0, 1, 2, 3]
CLASSES = [0, 1, 2]

op = st.one_of(
    st.tuples(st.just("run"), st.lists(st.integers(0, NUM_BLOCKS - 1), min_size=1, max_size=8),
              st.sampled_from(GROUPS), st.sampled_from(CLASSES)),
    st.tuples(st.just("add"), st.integers(0, NUM_BLOCKS - 1), st.sampled_from(GROUPS),
              st.sampled_from(CLASSES), st.booleans()),
    st.tuples(st.just("remove"), st.integers(0, NUM_BLOCKS - 1)),
    st.tuples(st.just("remove_many"), st.lists(st.integers(0, NUM_BLOCKS - 1), max_size=10)),
    st.tuples(st.just("victims"), st.integers(0, 6)),
    st.tuples(st.just("move"), st.sampled_from(GROUPS), st.sampled_from(CLASSES), st.booleans(),
              st.booleans()),
    st.tuples(st.just("peek"), st.integers(0, 5)),
)


def _same(runs: BlockRuns, ref: ClassedLRU, blocks: list[Block], groups: list[Group]) -> None:
    assert [(b.block_id, g, c) for b, g, c in runs.items()] == \
        [(k, g, c) for k, _, g, c in ref.items()]
    assert len(runs) == len(ref)
    for c in [*CLASSES, 3]:
        assert runs.count_below(c) == ref.count_below(c)
    for g in GROUPS:
        assert runs.node_class(g) == ref.node_class(g)
    for b in blocks:
        assert (b in runs) == (b.block_id in ref)
        if b in runs:
            assert runs.class_of(b) == ref.class_of(b.block_id)
    runs.check_integrity(groups)
    ref.check_integrity()


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60))
def test_same_order_as_classed_lru(ops) -> None:
    blocks = [Block(i) for i in range(NUM_BLOCKS)]
    runs: BlockRuns = BlockRuns()
    ref: ClassedLRU[int, Block] = ClassedLRU()
    groups = [Group(g, 0, [1], frozenset({"k"})) for g in GROUPS]  # kept across the whole run
    for o in ops:
        kind = o[0]
        if kind == "run":
            ids = list(dict.fromkeys(i for i in o[1] if i not in ref))
            if ids:
                runs.add_run([blocks[i] for i in ids], o[2], o[3])
                ref.add_run(ids, [blocks[i] for i in ids], o[2], o[3])
        elif kind == "add":
            if o[1] not in ref:
                runs.add(blocks[o[1]], o[2], o[3], front=o[4])
                ref.add(o[1], blocks[o[1]], o[2], o[3], front=o[4])
        elif kind == "remove":
            if o[1] in ref:
                runs.remove(blocks[o[1]])
                ref.remove(o[1])
        elif kind == "remove_many":
            ids = list(dict.fromkeys(i for i in o[1] if i in ref))
            runs.remove_many([blocks[i] for i in ids])
            ref.remove_many(ids)
        elif kind == "victims":  # an allocation: the first n victims taken out
            taken = runs.first(o[1])  # what `BlockPool.choose_victims` takes
            want = [k for (k, _), _ in zip(ref.victims(), range(o[1]))]
            assert [b.block_id for b in taken] == want
            runs.remove_many(taken)
            ref.remove_many(want)
        elif kind == "move":
            group = groups[o[1]] if o[4] else None
            assert runs.move_node(o[1], o[2], o[3], group) == ref.move_node(o[1], o[2], again=o[3])
        else:  # a partial read changes nothing (it may trim stale entries)
            got = [b.block_id for b, _ in zip(runs.victims(), range(o[1]))]
            assert got == [k for (k, _), _ in zip(ref.victims(), range(o[1]))]
            assert [b.block_id for b in runs.first(o[1])] == got
        _same(runs, ref, blocks, groups)


def test_a_front_run_that_lost_a_block_is_not_extended() -> None:
    """A block leaving a front run and filed at the front again must not be listed twice."""
    a, b = Block(0), Block(1)
    runs = BlockRuns()
    runs.add(a, 1, 0, front=True)
    runs.add(b, 1, 0, front=True)
    runs.remove(a)
    runs.add(a, 1, 0, front=True)
    assert list(runs.victims()) == [a, b]
    runs.check_integrity()


def test_a_group_never_moves_its_stale_cached_node() -> None:
    """A group caches its node on a move; once that node emptied (dropped) and another one was
    filed under the same id, a move reaches the new node, not the dropped one."""
    a, b = Block(0), Block(1)
    runs = BlockRuns()
    g = Group(1, 0, [1], frozenset({"k"}))
    runs.add(a, 1, 0)
    assert runs.move_node(1, 2, False, g)  # caches the node on the group
    runs.remove(a)  # the node empties: dropped
    runs.add(b, 1, 0)  # another node under the same id, in class 0
    assert runs.move_node(1, 2, False, g)
    assert [(x.block_id, n, c) for x, n, c in runs.items()] == [(1, 1, 2)]
    runs.check_integrity([g])
    runs.remove(b)  # dropped again, and no other node: the group forgets the dropped one
    assert not runs.move_node(1, 0, True, g)
    assert g.node is None
