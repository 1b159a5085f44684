"""How many drafts to ask for (`--speculative-draft-length fixed | adaptive`): a policy around a proposer.

A verify step's cost is set by the rows its linears run, and on the CPU they run in row buckets
(`models/linear.py`, MKL-packed weights for 1, 8 and 16 rows): SmolLM2 at 1,500 cached tokens, one
thread, process CPU time per forward over one decode row: 2-8 rows 1.33-1.44x, 9 rows 1.72x. Inside
a bucket a draft token costs nothing more, so a draft shorter than the bucket leaves free tokens
unverified, and one that spills into the next bucket pays a step up.

- `fixed`: at most `num_speculative_tokens` drafts every step (the proposer's own stop rules apply).
- `adaptive` (default): the draft fills the smallest bucket (`lengths[0]` drafts: 7 for 8 rows);
  after a draft the model accepted whole, the next one may grow to the next bucket (15), and it
  falls back at the first rejection, as vLLM / SGLang / Arctic adapt the draft length from recent
  acceptance. Agents copy long spans (files, diffs): there a whole draft is accepted again and
  again, and a longer one verifies about twice the tokens at 1.7/1.4 of the cost. Never more than
  `num_speculative_tokens`.

The buckets are CPU float32's (`MklPackedKernel`); CUDA and bfloat16 have none, and the policy is
still the default there. The buckets count a whole step's rows: with several decodes in a step the
scheduler caps the drafts by `--speculative-max-rows` (`engine/batching.py` `add_drafts`), and a
proposer gets `k` below its length then.

Offline, on the greedy outputs of swe-agent turns (tokens per forward, then the speed-up that the
cost model above gives): the old 4 quick turns ngram k=4 2.17 / 1.84x, k=7 2.38 / 2.05x, adaptive
7/15 2.56 / 2.18x; 16 turns k=4 2.78 / 2.26x, adaptive 3.79 / 3.03x. Through the engine, 8 quick
turns: 3.42 tokens per forward, 3.21x wall / 2.80x CPU time (docs/benchmarks/history/spec_decode.md).
"""

from __future__ import annotations

from hintkv.engine.sequence import Sequence
from hintkv.engine.spec.proposer import Proposer

DRAFT_LENGTHS = ("fixed", "adaptive")
BUCKET_LENGTHS = (7, 15)  # drafts that fill the verify step's 8- and 16-row buckets (1 real token + drafts)


class AdaptiveDraftLength:
    """A proposer's drafts sized per request from its last draft's acceptance (see the module doc)."""

    def __init__(self, inner: Proposer, num_speculative_tokens: int,
                 lengths: tuple[int, ...] = BUCKET_LENGTHS) -> None:
        self.inner = inner
        self.num_speculative_tokens = num_speculative_tokens
        self.lengths = tuple(sorted({min(n, num_speculative_tokens) for n in lengths}))
        # request id -> (its length step, drafts and accepted counters before its last draft, that draft's length)
        self._last: dict[str, tuple[int, int, int, int]] = {}

    def next_length(self, seq: Sequence) -> int:
        """The most drafts for `seq`'s next step: one step up after a whole draft accepted, back
        to the first step after any rejection."""
        last = self._last.get(seq.request_id)
        if last is None:
            return self.lengths[0]
        step, drafts0, accepted0, n = last
        if n and seq.num_draft_tokens - drafts0 == n and seq.num_accepted_tokens - accepted0 >= n:
            step = min(step + 1, len(self.lengths) - 1)
        elif n:
            step = 0
        return self.lengths[step]

    def propose(self, seq: Sequence, k: int) -> list[int]:
        length = self.next_length(seq)
        draft = self.inner.propose(seq, min(k, length))
        self._last[seq.request_id] = (self.lengths.index(length), seq.num_draft_tokens, seq.num_accepted_tokens,
                                      len(draft))
        return draft

    def on_finish(self, seq: Sequence) -> None:
        self._last.pop(seq.request_id, None)
        self.inner.on_finish(seq)
