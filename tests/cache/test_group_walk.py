"""`group_walk.settle_changes` against one eager step per change, on random groups and chains.

The walk has shortcuts (a group whose class no change reaches; a group the holder holds alone);
whatever the shape, its result must be what applying the changes one by one gives: each group's
counts and class after the last, which groups moved (re-filed in the order, written to the
delta) and the number of class moves; with several groups moving, the order of the node moves
is that of their last moves (then fewest holders, then position) and the delta's that of their
first moves; a group with no node in the order (`Group.node` None: no cached device blocks)
is not handed to it at all. The lazy/eager comparison (test_lazy_ranking.py) cannot see a wrong
shortcut, since both caches walk with it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.group_walk import Group, settle_changes

NUM_CLASSES = 6


def _eager(counts: list[int], chain: list[int]) -> tuple[list[int], int, int, int, int]:
    """(counts, moves, first, last, class) applying each change of `chain` on its own."""
    counts = list(counts)
    top = max(c for c, n in enumerate(counts) if n)
    moves = first = last = 0
    for j in range(1, len(chain)):
        counts[chain[j - 1]] -= 1
        counts[chain[j]] += 1
        now = max(c for c, n in enumerate(counts) if n)
        if now != top:
            moves += 1
            first = first or j
            last = j
        top = now
    return counts, moves, first, last, top


@st.composite
def _case(draw):
    chain = [draw(st.integers(0, NUM_CLASSES - 1))]
    for _ in range(draw(st.integers(1, 4))):  # consecutive classes differ (a change)
        chain.append(draw(st.sampled_from([c for c in range(NUM_CLASSES) if c != chain[-1]])))
    groups, has_node = [], []
    for _ in range(draw(st.integers(1, 4))):
        others = draw(st.lists(st.integers(0, 3), min_size=NUM_CLASSES, max_size=NUM_CLASSES))
        if draw(st.booleans()):
            others = [0] * NUM_CLASSES  # the holder holds it alone
        counts = list(others)
        counts[chain[0]] += 1  # the holder, at its class before the changes
        groups.append(counts)
        has_node.append(draw(st.booleans()))  # cached device blocks: a node in the order
    return chain, groups, has_node


class _Order:
    """Records the node moves (a victim order's `move_node`)."""

    def __init__(self) -> None:
        self.moves: list[tuple[int, int, bool]] = []

    def move_node(self, node: int, cls: int, again: bool = False, group: Group | None = None) -> bool:
        assert group is not None and group.gid == node, "a walk hands another group's node"
        assert group.node is not None, "a walk hands a group that has no node"
        self.moves.append((node, cls, again))
        return True


@settings(max_examples=400, deadline=None)
@given(_case())
def test_walk_is_one_eager_step_per_change(case):
    chain, all_counts, has_node = case
    groups = []
    for i, counts in enumerate(all_counts):
        holders = frozenset(f"k{i}_{j}" for j in range(sum(counts)))
        groups.append(Group(i, max(c for c, n in enumerate(counts) if n), list(counts),
                            holders))
        if has_node[i]:
            groups[-1].node = object()
    delta: dict[int, int | None] = {}
    order = _Order()
    num_moves = settle_changes(groups, chain, delta, order)
    want_moves, by_last, by_first = 0, [], []
    for i, (g, counts) in enumerate(zip(groups, all_counts)):
        after, moves, first, last, top = _eager(counts, chain)
        want_moves += moves
        assert g.counts == after, "counts differ from one step per change"
        assert g.top == top, "the class differs from one step per change"
        if moves:
            by_last.append(((last, len(g.holders), i), g.gid, top))
            by_first.append(((first, len(g.holders), i), g.gid))
    assert num_moves == want_moves
    assert order.moves == [(gid, top, True) for _, gid, top in sorted(by_last) if has_node[gid]]
    assert list(delta) == [gid for _, gid in sorted(by_first)]
    assert delta == {gid: top for _, gid, top in by_last}
