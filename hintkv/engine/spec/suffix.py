"""Session suffix statistics (`--speculative suffix`), after SuffixDecoding: draft from what
followed the current context's longest suffix anywhere in the session's text so far.

Every context of n tokens (n in [min_ngram, max_ngram]) seen in a session's requests and
responses maps to the counts of the tokens that followed it (a suffix tree's paths, flattened to
depth `max_ngram`). A draft walks greedily: the most frequent next token after the longest
matching suffix, appended, again, while the product of the walk's empirical probabilities stays
above `min_score` (SuffixDecoding's adaptive draft length: frequent paths give long drafts,
ambiguous ones short). Unlike prompt lookup, it remembers what the session's earlier requests
produced even when a later prompt no longer holds it, and it prefers the continuation that
recurred most, not the latest. `scope="tenant"` pools every session of a tenant.

Consecutive requests of an agent share their prefix: a request indexes only its tokens after
the longest common prefix with the session's previous request, so repeated context is not
counted once per turn. Sessions are bounded (least recently used forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from hintkv.engine.sequence import Sequence


@dataclass(slots=True)
class SessionText:
    """One session's (or tenant's) suffix counts and its previous request's tokens."""

    counts: dict[tuple[int, ...], dict[int, int]] = field(default_factory=dict)
    prev: list[int] = field(default_factory=list)
    num_tokens_indexed: int = 0

    def add(self, tokens: list[int], start: int, stop: int, min_n: int, max_n: int) -> None:
        """Count every (context ending at e, tokens[e]) for e in [start, stop)."""
        for e in range(max(start, 1), stop):
            nxt = tokens[e]
            for n in range(min_n, min(max_n, e) + 1):
                d = self.counts.setdefault(tuple(tokens[e - n:e]), {})
                d[nxt] = d.get(nxt, 0) + 1
        self.num_tokens_indexed += max(0, stop - max(start, 1))


@dataclass(slots=True)
class _RequestState:
    text: SessionText
    num_indexed: int  # tokens[e] for e < num_indexed are counted


class SuffixProposer:
    def __init__(self, num_speculative_tokens: int, min_ngram: int = 2, max_ngram: int = 8,
                 min_score: float = 0.1, scope: str = "session", max_sessions: int = 1024) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        if scope not in ("session", "tenant"):
            raise ValueError(f"scope must be session or tenant, not {scope!r}")
        self.num_speculative_tokens = num_speculative_tokens
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.min_score = min_score
        self.scope = scope
        self.max_sessions = max_sessions
        self._texts: OrderedDict[str, SessionText] = OrderedDict()
        self._requests: dict[str, _RequestState] = {}

    def _key(self, seq: Sequence) -> str:
        ref = seq.session
        if ref is None:
            return "request:" + seq.request_id  # no session: the request's own text only
        return f"{ref.tenant}\0" if self.scope == "tenant" else f"{ref.tenant}\0{ref.session_id}"

    def _state(self, seq: Sequence) -> _RequestState:
        st = self._requests.get(seq.request_id)
        if st is None:
            key = self._key(seq)
            text = self._texts.pop(key, None) or SessionText()
            self._texts[key] = text  # most recently used last
            while len(self._texts) > self.max_sessions:
                self._texts.popitem(last=False)
            st = self._requests[seq.request_id] = _RequestState(text, _common_prefix(seq.token_ids, text.prev))
        return st

    def propose(self, seq: Sequence, k: int) -> list[int]:
        st = self._state(seq)
        tokens = seq.token_ids
        st.text.add(tokens, st.num_indexed, len(tokens), self.min_ngram, self.max_ngram)
        st.num_indexed = len(tokens)
        return self.draft(st.text, tokens[-self.max_ngram:], min(k, self.num_speculative_tokens))

    def draft(self, text: SessionText, tail: list[int], k: int) -> list[int]:
        out: list[int] = []
        score = 1.0
        ctx = list(tail)
        while len(out) < k:
            for n in range(min(self.max_ngram, len(ctx)), self.min_ngram - 1, -1):
                d = text.counts.get(tuple(ctx[len(ctx) - n:]))
                if d:
                    break
            else:
                break
            tok, c = max(d.items(), key=lambda kv: kv[1])
            score *= c / sum(d.values())
            if score < self.min_score:
                break
            out.append(tok)
            ctx.append(tok)
        return out

    def on_finish(self, seq: Sequence) -> None:
        st = self._requests.pop(seq.request_id, None)
        if st is None:
            return
        st.text.add(seq.token_ids, st.num_indexed, seq.num_tokens, self.min_ngram, self.max_ngram)
        if seq.session is None:
            self._texts.pop(self._key(seq), None)
        else:
            st.text.prev = list(seq.token_ids)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
