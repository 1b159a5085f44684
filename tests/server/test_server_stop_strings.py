"""StopStringMatcher: the text sent equals the whole text cut at the first stop string."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.server.stop_strings import StopStringMatcher

ALPHABET = "abc"


def _send(pieces: list[str], stops: list[str]) -> tuple[str, bool, list[str]]:
    matcher = StopStringMatcher(stops)
    sent = [matcher.feed(p) for p in pieces]
    if not matcher.stopped:
        sent.append(matcher.flush())
    return "".join(sent), matcher.stopped, sent


def _expected(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    """Generation ends at the first step whose text holds a stop string (a longer stop string
    that would only have completed later is never generated); the text is cut where the
    earliest stop string found by then begins."""
    text = ""
    for piece in pieces:
        text += piece
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            return text[: min(hits)], True
    return text, False


@settings(deadline=None)  # no timed assertions: a loaded machine must not fail this test
@given(
    pieces=st.lists(st.text(ALPHABET, max_size=4), max_size=12),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=3), min_size=1, max_size=3),
)
def test_output_is_text_cut_at_first_stop(pieces, stops):
    text, stopped, sent = _send(pieces, stops)
    assert (text, stopped) == _expected(pieces, stops)
    # Nothing sent before the end ever contains a stop string.
    for i in range(len(sent)):
        assert not any(s in "".join(sent[: i + 1]) for s in stops)


def test_a_stop_completed_first_wins_over_a_longer_one_begun_earlier():
    # "cbb" begins first but "b" completes first: the engine stops there, "cbb" never comes.
    assert _send(["c", "b", "b"], ["b", "cbb"])[:2] == ("c", True)
    assert _send(["cbb"], ["b", "cbb"])[:2] == ("", True)  # both in one piece: earliest start


def test_stop_across_pieces_is_never_partly_sent():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("hello ST") == "hello"
    assert matcher.feed("O") == " "  # "STO" may still become "STOP": held
    assert matcher.feed("P and more") == ""
    assert matcher.stopped and matcher.feed("later") == "" and matcher.flush() == ""


def test_held_text_is_released_at_the_end():
    matcher = StopStringMatcher(["xyz"])
    assert matcher.feed("abcxy") == "abc"
    assert matcher.flush() == "xy"
    assert not matcher.stopped


def test_no_stops_sends_everything_at_once():
    matcher = StopStringMatcher([])
    assert matcher.feed("abc") == "abc" and matcher.flush() == ""


def test_free_text_is_never_matched_alone_but_may_begin_a_stop():
    """min_tokens: `free` text cannot hold a whole stop string; one that begins in its last characters
    and ends in later text still matches (vLLM's search window)."""
    m = StopStringMatcher(["ab", "x"])
    assert m.feed("", free="x-ab-a") == "x-ab-"  # nothing matched; "a" may begin "ab"
    assert not m.stopped
    assert m.feed("b-x") == ""  # "ab" straddles the free text's end
    assert m.stopped
    m = StopStringMatcher(["ab"])
    assert m.feed("", free="ab") == "a" and m.feed("zab") == "bz" and m.stopped
