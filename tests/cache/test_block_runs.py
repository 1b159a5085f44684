"""`BlockRuns` (the device pool's victim order by runs) against `ClassedLRU` (one entry per block,
the simple reference): after any sequence of filings (runs, single blocks at the back or the
front), removals (single, many, victims taken from the front by `first`), node moves and partial reads of
the victim order, both give the same order, counts and classes. Filings hand the ranking's
group of their id (none for id 0, the unheld blocks), which `BlockRuns` links to its node exactly
(`Group.node`: set when the node is made, cleared when it empties), so a move handing the group
reads no node map; a group dropped and made again under the same id (`regroup`) gets the new
node, never the old one."""

from __future__ import annotations

import pytest
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
    st.tuples(st.just("regroup"), st.sampled_from(GROUPS[1:])),
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
    live = [g for g in groups if g is not None]
    for g in live:  # the simple reference of the link: a node filed under its id, or none
        assert (g.node is None) == (ref.node_class(g.gid) is None)
    runs.check_integrity(live)
    ref.check_integrity()


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60))
def test_same_order_as_classed_lru(ops) -> None:
    blocks = [Block(i) for i in range(NUM_BLOCKS)]
    runs: BlockRuns = BlockRuns()
    ref: ClassedLRU[int, Block] = ClassedLRU()
    # the ranking's groups by id (id 0: the unheld blocks, no group)
    groups = [None] + [Group(g, 0, [1], frozenset({"k"})) for g in GROUPS[1:]]
    dead: list[Group] = []
    for o in ops:
        kind = o[0]
        if kind == "run":
            ids = list(dict.fromkeys(i for i in o[1] if i not in ref))
            if ids:
                runs.add_run([blocks[i] for i in ids], o[2], o[3], groups[o[2]])
                ref.add_run(ids, [blocks[i] for i in ids], o[2], o[3])
        elif kind == "add":
            if o[1] not in ref:
                runs.add(blocks[o[1]], o[2], o[3], front=o[4], group=groups[o[2]])
                ref.add(o[1], blocks[o[1]], o[2], o[3], front=o[4])
        elif kind == "regroup":  # the ranking drops the group (it has no cached block) and
            if ref.node_class(o[1]) is None:  # later makes another one under the same id
                dead.append(groups[o[1]])
                groups[o[1]] = Group(o[1], 0, [1], frozenset({"k"}))
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
            if dead and o[4]:  # a dropped group has no node: a move handing it moves nothing
                assert not runs.move_node(dead[-1].gid, o[2], o[3], dead[-1])
        else:  # a partial read changes nothing (it may trim stale entries)
            got = [b.block_id for b, _ in zip(runs.victims(), range(o[1]))]
            assert got == [k for (k, _), _ in zip(ref.victims(), range(o[1]))]
            assert [b.block_id for b in runs.first(o[1])] == got
        assert all(g.node is None for g in dead), "a dropped group is still linked"
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


def test_a_group_is_linked_to_its_node_while_it_has_cached_blocks() -> None:
    """A filing links the group to its node; the node's last block leaving unlinks it (a move
    handing the group then moves nothing, reading no map); a group made again under the same id
    gets the new node, and the dropped one stays unlinked."""
    a, b = Block(0), Block(1)
    runs = BlockRuns()
    g = Group(1, 0, [1], frozenset({"k"}))
    runs.add(a, 1, 0, group=g)
    assert g.node is not None
    assert runs.move_node(1, 2, False, g)
    runs.remove(a)  # the node empties: dropped and unlinked
    assert g.node is None
    assert not runs.move_node(1, 0, True, g)
    again = Group(1, 0, [1], frozenset({"k"}))  # the ranking's new group under the same id
    runs.add(b, 1, 0, group=again)
    assert g.node is None and again.node is not None
    assert runs.move_node(1, 2, False, again)
    assert [(x.block_id, n, c) for x, n, c in runs.items()] == [(1, 1, 2)]
    runs.check_integrity([again])


def test_integrity_catches_a_group_out_of_step_with_its_node() -> None:
    """The cross-structure invariant: a group's `node` is exactly its node here, and each node
    is linked to the group of its id."""
    runs = BlockRuns()
    g = Group(1, 0, [1], frozenset({"k"}))
    runs.add(Block(0), 1, 0, group=g)
    runs.check_integrity([g])
    node, g.node = g.node, None
    with pytest.raises(AssertionError, match="not its node"):
        runs.check_integrity([g])
    g.node = node
    with pytest.raises(AssertionError, match="linked to another group"):
        runs.check_integrity([])  # node 1's group is not among the ranking's groups
