"""A group of blocks (the blocks one set of live sessions holds) and the walk of one session's
class changes over its groups: what `cache.ranking` applies when it settles.

A group's class is the highest class among its holders (`counts`: holders per class). One holder
moving old -> new changes that class only past the top: up when new is above it, down when the
holder was the last one at the top. `settle_changes` replays a session's changes (old, c1, ...,
now) on each of its groups at once and re-files each group whose class moved at any of them
(its class after the last; where the changes at which it first and last moved put it): what one
eager walk per change would have done, in one pass.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Protocol


@dataclass(slots=True)
class Group:
    # (the fields a request end's walk reads come first: one cache line of the object)
    gid: int  # its id: the XOR of its holders' tokens
    top: int  # the group's class: the highest class with a holder
    counts: list[int]  # holders per class
    holders: frozenset[str]  # fixed: another holder set is another group
    # held by one session (its own context): read by every walk, kept so a walk does not
    # touch the holder set (a cache miss per group in a request's end)
    alone: bool = field(init=False)
    # the device pool's node of this group, exactly (`BlockRuns` links it when the group's first
    # cached block is filed and unlinks it when its last leaves): None, no cached device block,
    # so a walk moves no node (most waiting sessions' own context at a small pool)
    node: object = field(default=None, init=False)
    num_blocks: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.alone = len(self.holders) == 1


class NodeOrder(Protocol):
    """A victim order with one node per group, linked to it (`cache.block_runs.BlockRuns`)."""

    def move_node(self, node: int, cls: int, again: bool = False,
                  group: Group | None = None) -> bool: ...  # `group`: its `node` is the node


# a moved group's sort entry: (last change, holders, position, first change, group, class)
_first_move = itemgetter(3, 1, 2)
_last_move = itemgetter(0, 1, 2)


def settle_changes(groups: Collection[Group], chain: list[int], delta: dict[int, int | None],
                   order: NodeOrder | None) -> int:
    """Apply one holder's class changes `chain` (old, c1, ..., now) to each of `groups` as one
    walk: counts as after the last change, `top` set, and each group whose class moved at any
    change written to `delta` and, if it has a node in `order` (`Group.node`: the device pool's
    `BlockRuns`), moved there (`move_node(gid, cls, again=True, group)`)
    where one eager walk per change leaves it (`move_orders`). Returns the class moves one
    walk per change makes. Two shapes take no per-change loop (a request's end meets both: its
    own context, a prefix others hold): a group whose class no change reaches only has its
    counts moved by the net change, and a group the holder holds alone moves at every change
    (consecutive classes of a chain differ), to the last."""
    first_cls, last_cls, hi = chain[0], chain[-1], max(chain)
    num_changes = len(chain) - 1
    # the usual shape (a request's end): one group held by this holder alone (its own context),
    # every other one held higher by others; then only the lone group moves, to the last class
    alone = None
    for g in groups:
        if g.top > hi:
            continue
        if alone is not None or not g.alone:
            break
        alone = g
    else:
        if first_cls != last_cls:
            for g in groups:
                counts = g.counts
                counts[first_cls] -= 1
                counts[last_cls] += 1
        if alone is None:
            return 0
        alone.top = last_cls  # `_file`, inline (a call less on every request's end)
        delta[alone.gid] = last_cls
        if alone.node is not None:
            order.move_node(alone.gid, last_cls, True, alone)
        return num_changes
    moved = []
    num_moves = 0
    for i, g in enumerate(groups):
        top = g.top
        if top > hi:  # its class is held higher by others: no change moves it
            if first_cls != last_cls:
                counts = g.counts
                counts[first_cls] -= 1
                counts[last_cls] += 1
            continue
        counts = g.counts
        if g.alone:  # held by this holder alone: its class is the holder's
            counts[first_cls] -= 1
            counts[last_cls] += 1
            num_moves += num_changes
            moved.append((num_changes, i, 1, g, last_cls))
            continue
        first = last = 0
        o = first_cls
        for j in range(1, num_changes + 1):
            n = chain[j]
            counts[o] -= 1
            counts[n] += 1
            if n > top:
                top = n
            elif o == top and not counts[o]:
                top = o - 1
                while not counts[top]:
                    top -= 1
            else:
                o = n
                continue
            o = n
            num_moves += 1
            first = first or j
            last = j
        if last:
            moved.append((last, i, first, g, top))
    if len(moved) == 1:  # (a request's end: its own context)
        _, _, _, g, top = moved[0]
        ordered = [(g, top)]
    elif moved:
        by_first, ordered = move_orders(moved)
        for g, top in by_first:  # where the eager moves first put them
            if g.gid not in delta:
                delta[g.gid] = top
    else:
        return num_moves
    for g, top in ordered:
        _file(g, top, delta, order)
    return num_moves


def _file(g: Group, top: int, delta: dict[int, int | None], order: NodeOrder | None) -> None:
    """`g`'s class is `top` now: written to the delta, its node (if any) at the back of `top`."""
    g.top = top
    delta[g.gid] = top
    if g.node is not None:
        order.move_node(g.gid, top, True, g)


def move_orders(moved: list[tuple]) -> tuple[list[tuple[Group, int]], list[tuple[Group, int]]]:
    """(group, class) of `settle_changes`' moved groups in the order their first moves reached
    the delta and in the order of their last moves. A walk goes tail first: fewest holders
    first (holder sets nest along a prefix, so fewer holders = deeper); ties in the order the
    session joined them (positions are unique: groups are never compared)."""
    keyed = [(m[0], len(m[3].holders), m[1], m[2], m[3], m[4]) for m in moved]
    by_first = [(m[4], m[5]) for m in sorted(keyed, key=_first_move)]
    keyed.sort(key=_last_move)
    return by_first, [(m[4], m[5]) for m in keyed]
