"""The raw-text depth check (`limits._check_raw_depth`) agrees with the walk over the parsed
value: hypothesis builds nested JSON (keys and strings full of brackets, quotes and escapes),
and for every body within json's recursion limit both give the same answer: accepted, or a 400
naming the same field. Deeper bodies get that answer too, without json.loads recursing."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.server.errors import APIError
from hintkv.server.limits import RequestLimits, check_json, parse_json

LIMITS = RequestLimits(max_depth=6)
_tricky = st.text(alphabet='[]{}"\\ab:,', max_size=6)
_values = st.recursive(
    st.one_of(st.integers(), st.none(), _tricky),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(_tricky, inner, max_size=3)),
    max_leaves=30,
)


def _answer(fn, *args) -> str | None:
    try:
        fn(*args)
    except APIError as exc:
        return f"400 {exc.param}"
    return None


@settings(max_examples=400, deadline=None)
@given(value=_values)
def test_raw_depth_check_names_the_field_the_walk_names(value):
    raw = json.dumps(value).encode()
    walked = _answer(lambda: check_json(json.loads(raw), LIMITS))
    assert _answer(parse_json, raw, LIMITS) == walked


def test_a_body_past_the_recursion_limit_names_the_field():
    raw = ('{"a": [1, {"b\\"]": ' + "[" * 50_000 + "]" * 50_000 + "}]}").encode()
    assert _answer(parse_json, raw, LIMITS) == "400 a[1].b\"][0][0][0]"


def test_the_walk_still_enters_a_list_whose_first_items_are_token_ids():
    """A list of numbers is passed over in one C pass (a 2,048-id prompt); one string, list or object
    anywhere in it still gets its checks, by the same path."""
    limits = RequestLimits(max_string_chars=8)
    check_json({"prompt": list(range(2048))}, limits)
    assert _answer(check_json, {"prompt": [*range(100), "x" * 9]}, limits) == "400 prompt[100]"
    assert _answer(check_json, {"prompt": [1, 2, {"a": ["y" * 9]}]}, limits) == "400 prompt[2].a[0]"
