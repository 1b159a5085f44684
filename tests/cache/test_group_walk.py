"""`group_walk.walk_changes` against one eager step per change, on random groups and chains.

The walk has shortcuts (a group whose class no change reaches; a group the holder holds alone);
whatever the shape, its result must be what applying the changes one by one gives: each group's
counts after the last, which groups moved, at which changes they first and last moved, their
class after the last, and the number of class moves. The lazy/eager comparison
(test_lazy_ranking.py) cannot see a wrong shortcut, since both caches walk with it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.group_walk import Group, walk_changes

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
    groups = []
    for _ in range(draw(st.integers(1, 4))):
        others = draw(st.lists(st.integers(0, 3), min_size=NUM_CLASSES, max_size=NUM_CLASSES))
        if draw(st.booleans()):
            others = [0] * NUM_CLASSES  # the holder holds it alone
        counts = list(others)
        counts[chain[0]] += 1  # the holder, at its class before the changes
        groups.append(counts)
    return chain, groups


@settings(max_examples=400, deadline=None)
@given(_case())
def test_walk_is_one_eager_step_per_change(case):
    chain, all_counts = case
    groups = []
    for i, counts in enumerate(all_counts):
        holders = frozenset(f"k{i}_{j}" for j in range(sum(counts)))
        groups.append(Group(i, holders, list(counts),
                            max(c for c, n in enumerate(counts) if n)))
    num_moves, moved = walk_changes(groups, chain)
    want_moves = 0
    by_group = {m[3].gid: m for m in moved}
    assert len(by_group) == len(moved), "a group is reported twice"
    for i, (g, counts) in enumerate(zip(groups, all_counts)):
        after, moves, first, last, top = _eager(counts, chain)
        want_moves += moves
        assert g.counts == after, "counts differ from one step per change"
        if moves:
            assert by_group[g.gid] == (last, i, first, g, top)
        else:
            assert g.gid not in by_group, "a group that never moved is reported"
    assert num_moves == want_moves
