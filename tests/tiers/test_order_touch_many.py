"""`ClassedLRU.touch_many` (a load's run touched as one call) against one `touch` per key."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.tiers.order import ClassedLRU


def _build(filings: list[tuple[int, int, int]]) -> ClassedLRU[int, None]:
    order: ClassedLRU[int, None] = ClassedLRU()
    for key, node, cls in filings:
        if key not in order:
            order.add(key, None, node, cls)
    return order


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 4), st.integers(0, 2)), max_size=30),
       st.lists(st.integers(0, 20), max_size=25))
def test_touch_many_is_one_touch_each(filings, touches) -> None:
    a, b = _build(filings), _build(filings)
    keys = [k for k in touches if k in a]
    for k in keys:
        a.touch(k)
    b.touch_many(keys)
    assert list(a.items()) == list(b.items())
    b.check_integrity()
