"""Placement without HTTP: affinity, sub-agents next to their parent when there is room,
least-loaded fallback, moving off a down instance, the bounded session table."""

from __future__ import annotations

import pytest

from hintkv.router.affinity import Placement
from hintkv.router.backends import Backends

A, B, C = "http://a", "http://b", "http://c"


@pytest.fixture
def placement():
    return Placement(Backends([A, B, C]), max_inflight=2, max_sessions=4)


def test_affinity_parent_and_least_loaded(placement):
    p = placement
    first = p.choose("root", "root")
    assert p.choose("root", "root") is first  # affinity
    assert p.choose("sub", "root") is first  # next to its parent's prefix
    other = p.choose("root2", "root2")
    assert other is not first  # least loaded: fewer sessions
    first.inflight = 2  # the parent's instance is full: the next sub-agent goes elsewhere
    assert p.choose("sub2", "root") is not first
    assert (p.num_affinity, p.num_parent) == (1, 1)
    p.check_integrity()


def test_a_down_instance_loses_its_sessions_to_the_others(placement):
    p = placement
    b = p.choose("s", "s")
    b.up = False
    moved = p.choose("s", "s")
    assert moved is not b and moved.up and p.num_moved == 1
    assert p.lookup("s") is moved
    for x in p.backends.backends.values():
        x.up = False
    assert p.choose("s", "s") is None
    p.check_integrity()


def test_the_session_table_is_bounded_and_forget_works(placement):
    p = placement
    for i in range(6):
        p.choose(f"s{i}", f"s{i}")
    assert p.lookup("s0") is None and p.lookup("s5") is not None
    p.forget("s5")
    assert p.lookup("s5") is None
    p.check_integrity()


def test_backends_are_validated():
    with pytest.raises(ValueError):
        Backends([])
    with pytest.raises(ValueError):
        Backends([A, A + "/"])


def test_an_evict_fans_out_only_where_the_session_tree_was_placed(placement):
    p = placement
    home = p.choose("root", "root")
    assert p.fanout_targets("root") == {home.url}
    home.inflight = 2  # full: the sub-agent and its own sub-agent go elsewhere
    away = p.choose("sub", "root")
    assert away is not home
    away.inflight = 2
    deeper = p.choose("subsub", "sub")
    assert deeper not in (home, away)
    # the root's evict ends the whole tree: every instance a member ran on; a leaf only its own
    assert p.fanout_targets("root") == {home.url, away.url, deeper.url}
    assert p.fanout_targets("sub") == {away.url, deeper.url}
    assert p.fanout_targets("subsub") == {deeper.url}
    home.up = False  # the root moves: its old instance stays on the trail (blocks left behind)
    moved = p.choose("root", "root")
    assert moved is not home and home.url in p.fanout_targets("root")
    assert p.fanout_targets("never-seen") is None and p.fanout_targets(None) is None
    p.check_integrity()
