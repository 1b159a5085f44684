"""`ClassRanking.check_integrity`: every group, count and class recomputed from the sessions.

Slow on purpose (tests and debugging): the sessions' held lists are the truth; the ranking's
groups (holders, sizes, per-class counts, class), each session's group map and each block's
group must be what they say.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from hintkv.cache.hashing import BlockHash

if TYPE_CHECKING:
    from hintkv.cache.ranking import ClassRanking
    from hintkv.cache.sessions import Session


def check_ranking(r: ClassRanking, sessions: Mapping[str, Session]) -> None:
    r.settle()
    holders: dict[BlockHash, set[str]] = {}
    for s in sessions.values():
        if s.held:
            assert s.rank_cls is not None, \
                f"session {s.session_id} holds blocks but has no class"
        for h in s.held:
            holders.setdefault(h, set()).add(s.key)
    assert holders.keys() == r._group_of.keys(), "held hashes out of sync with groups"
    sizes: dict[int, int] = {}
    for h, ks in holders.items():
        gid = r._group_of[h]
        g = r._groups[gid]
        assert g.holders == ks, f"block in a group of other holders ({len(g.holders)} vs {len(ks)})"
        sizes[gid] = sizes.get(gid, 0) + 1
    assert sizes == {gid: g.num_blocks for gid, g in r._groups.items()}, \
        "group sizes out of sync (or an empty group was kept)"
    for gid, g in r._groups.items():
        assert g.gid == gid, "a group is filed under another id"
        assert g.alone == (len(g.holders) == 1), "a group's lone-holder flag is stale"
        counts = [0] * r.num_classes
        for k in g.holders:
            counts[sessions[k].rank_cls] += 1
            assert any(x is g for x in sessions[k].rank_groups), "a holder does not list its group"
        assert counts == g.counts, "a group's class counts are stale"
        assert g.top == max(c for c, n in enumerate(counts) if n), "a group's class is stale"
    for s in sessions.values():
        mine = s.rank_groups
        assert len({id(g) for g in mine}) == len(mine), "a session lists a group twice"
        assert all(r._groups.get(g.gid) is g and s.key in g.holders for g in mine), \
            "a session lists a group it does not hold"
        assert not mine or r._holder.get(s.key) is s, "a holder is filed under another session"
