"""Draft proposers (`engine/spec/`): prompt lookup over a request, suffix counts over a session."""

import pytest

from hintkv.cache.hashing import namespace_root
from hintkv.cache.types import SessionRef
from hintkv.engine.sequence import Sequence
from hintkv.config import EngineConfig
from hintkv.engine.spec import AdaptiveDraftLength, make_proposer, make_speculative
from hintkv.engine.spec.ngram import NgramIndex
from hintkv.engine.types import SamplingParams

ROOT = namespace_root("test", "float32", 4, None)


def seq(rid, tokens, session=None):
    return Sequence(rid, list(tokens), len(tokens), SamplingParams(temperature=0), ROOT, session=session)


def test_ngram_proposes_what_followed_the_latest_match():
    s = seq("a", [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 6, 7, 8, 0, 3, 4])
    p = make_proposer("ngram", 3)
    assert p.propose(s, 3) == [6, 7, 8]  # "3 4" last seen before "6 7 8"
    s.token_ids += [6]
    assert p.propose(s, 2) == [7, 8]  # the index grows with the sequence
    assert p.propose(seq("b", [5, 6, 7, 8]), 3) == []  # nothing repeats
    assert p.propose(s, 0) == []


def test_ngram_extends_a_repeating_span_past_the_end():
    idx = NgramIndex(2, 4)
    tokens = [9, 1, 2, 1, 2]
    assert idx.lookup(tokens, 5) == [1, 2, 1, 2, 1]


def test_unknown_proposer_is_refused():
    with pytest.raises(ValueError, match="speculative"):
        make_proposer("eagle", 4)


def test_suffix_remembers_the_sessions_earlier_responses():
    ref = SessionRef("t", "s1", "")
    p = make_proposer("suffix", 4)
    first = seq("r1", [10, 11, 12], session=ref)
    first.token_ids += [40, 41, 42, 43, 44]  # the response
    assert p.propose(first, 4) == []  # nothing seen twice yet... (only in-request text)
    p.on_finish(first)
    # a later request of the session whose prompt no longer holds that response
    later = seq("r2", [20, 21, 40, 41], session=ref)
    assert p.propose(later, 4) == [42, 43, 44]
    other = seq("r3", [20, 21, 40, 41], session=SessionRef("t", "s2", ""))
    assert p.propose(other, 4) == []  # another session's text is not this one's
    tenant = make_proposer("suffix", 4, scope="tenant")
    tenant.on_finish(first)  # no state for r1 there: nothing learned
    a = seq("x1", [1, 2, 3, 4, 5], session=SessionRef("t", "s1", ""))
    tenant.propose(a, 4)
    tenant.on_finish(a)
    assert tenant.propose(seq("x2", [7, 2, 3], session=SessionRef("t", "s9", "")), 4) == [4, 5]


def test_suffix_prefers_the_most_frequent_continuation_and_counts_shared_prefixes_once():
    ref = SessionRef("t", "s", "")
    p = make_proposer("suffix", 4)
    base = [1, 2, 3, 1, 2, 3, 1, 2, 4]
    r1 = seq("r1", base, session=ref)
    p.propose(r1, 4)
    p.on_finish(r1)
    text = next(iter(p._texts.values()))
    assert text.counts[(1, 2)] == {3: 2, 4: 1}
    r2 = seq("r2", base + [5], session=ref)  # the next turn: same prefix, one more token
    p.propose(r2, 4)
    assert text.counts[(1, 2)] == {3: 2, 4: 1}  # the shared prefix was not counted again
    assert p.draft(text, [7, 1, 2], 1) == [3]


class _Fixed:
    """A proposer that always has `n` drafts (records the k it was asked for)."""

    num_speculative_tokens = 15

    def __init__(self, n):
        self.n, self.asked, self.finished = n, [], []

    def propose(self, s, k):
        self.asked.append(k)
        return list(range(min(k, self.n)))

    def on_finish(self, s):
        self.finished.append(s.request_id)


def _verified(s, drafted, accepted):
    s.num_draft_tokens += drafted  # what the scheduler's update records after the verify
    s.num_accepted_tokens += accepted


def test_adaptive_draft_length_grows_after_a_whole_draft_and_falls_back_at_a_rejection():
    inner = _Fixed(99)
    p = AdaptiveDraftLength(inner, 15)
    s = seq("a", [1, 2, 3])
    assert len(p.propose(s, 15)) == 7  # the first draft fills the 8-row bucket
    _verified(s, 7, 7)  # accepted whole
    assert len(p.propose(s, 15)) == 15  # the next may fill the 16-row one
    _verified(s, 15, 15)
    assert len(p.propose(s, 15)) == 15  # the top step stays while whole drafts are accepted
    _verified(s, 15, 3)  # rejected at the 4th
    assert len(p.propose(s, 15)) == 7
    _verified(s, 7, 7)
    assert len(p.propose(s, 10)) == 10  # the scheduler's room still caps it
    other = seq("b", [1, 2, 3])
    assert len(p.propose(other, 15)) == 7  # per request
    p.on_finish(s)
    assert inner.finished == ["a"] and "a" not in p._last


def test_adaptive_draft_length_never_passes_num_speculative_tokens_and_keeps_its_step_without_a_draft():
    p = AdaptiveDraftLength(_Fixed(99), 4)
    assert p.lengths == (4,)
    s = seq("a", [1])
    assert len(p.propose(s, 15)) == 4
    _verified(s, 4, 4)
    assert len(p.propose(s, 15)) == 4
    q = AdaptiveDraftLength(_Fixed(0), 15)  # no draft: nothing verified, the step is kept
    t = seq("b", [1])
    assert q.propose(t, 15) == [] and q.propose(t, 15) == [] and q.next_length(t) == 7
    r = AdaptiveDraftLength(_Fixed(99), 15)
    u = seq("c", [1])
    r.propose(u, 15)
    _verified(u, 0, 0)  # proposed but not scheduled (no KV room): back to the first step
    assert r.next_length(u) == 7


def test_make_speculative_wraps_the_proposer_in_the_configured_draft_length():
    adaptive = make_speculative(EngineConfig(speculative="ngram"))
    assert isinstance(adaptive, AdaptiveDraftLength) and adaptive.lengths == (7, 15)
    fixed = make_speculative(EngineConfig(speculative="suffix", speculative_draft_length="fixed",
                                          num_speculative_tokens=5))
    assert fixed.num_speculative_tokens == 5 and not isinstance(fixed, AdaptiveDraftLength)
    with pytest.raises(ValueError, match="speculative_draft_length"):
        EngineConfig(speculative="ngram", speculative_draft_length="longest")
