"""Prompt lookup (`--speculative ngram`): find the sequence's last n tokens earlier in its own
prompt + output and propose what followed them there.

Agents copy long spans from their context (file contents, diffs, repeated commands); when the
last few generated tokens already occurred in the context, the tokens after that occurrence are
a good draft. Longest n first (`max_ngram` down to `min_ngram`), most recent occurrence.

Each sequence keeps an incremental index (n-gram -> the position after its latest occurrence),
so a step costs O(max_ngram) per sequence, not a scan of the whole context.
"""

from __future__ import annotations

from hintkv.engine.sequence import Sequence


class NgramIndex:
    """n-gram (n in [min_n, max_n]) -> end position of its latest occurrence in `tokens`, built
    incrementally as tokens are appended. The latest occurrence of the query itself (the
    sequence's own tail) is excluded by looking up before indexing the tail."""

    __slots__ = ("last_end", "max_n", "min_n", "num_indexed")

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.last_end: dict[tuple[int, ...], int] = {}
        self.num_indexed = 0  # n-grams ending before this position are indexed

    def extend(self, tokens: list[int], upto: int) -> None:
        """Index every n-gram that ends at a position < `upto`."""
        for end in range(max(self.num_indexed, 1), upto + 1):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.last_end[tuple(tokens[end - n:end])] = end
        self.num_indexed = max(self.num_indexed, upto + 1)

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Draft: what followed the longest earlier match of the tail of `tokens`; when that
        runs into the end of the context (a repeating span), look up again on the drafted tail."""
        total = len(tokens)
        self.extend(tokens, total - 1)  # every n-gram but those ending at the tail itself
        draft: list[int] = []
        while len(draft) < k:
            tail = tokens[-self.max_n:] + draft
            for n in range(min(self.max_n, len(tail)), self.min_n - 1, -1):
                end = self.last_end.get(tuple(tail[len(tail) - n:]))
                if end is not None:
                    draft.extend(tokens[end:end + k - len(draft)])
                    break
            else:
                break
        return draft


class NgramProposer:
    """Prompt lookup over each request's own prompt and output."""

    def __init__(self, num_speculative_tokens: int, min_ngram: int = 2, max_ngram: int = 5) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.num_speculative_tokens = num_speculative_tokens
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self._index: dict[str, NgramIndex] = {}  # request id -> its index

    def propose(self, seq: Sequence, k: int) -> list[int]:
        idx = self._index.get(seq.request_id)
        if idx is None:
            idx = self._index[seq.request_id] = NgramIndex(self.min_ngram, self.max_ngram)
        return idx.lookup(seq.token_ids, min(k, self.num_speculative_tokens))

    def on_finish(self, seq: Sequence) -> None:
        self._index.pop(seq.request_id, None)
