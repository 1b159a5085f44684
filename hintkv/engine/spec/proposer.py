"""The proposer contract: a draft of the next tokens of a sequence from text already seen.

A proposer is pure bookkeeping (no tensors, no model). The scheduler asks it for at most `k`
drafts for a decoding sequence, and tells it when a sequence finishes (a session-wide proposer
keeps that request's text for the session's later requests). Drafts are only a guess: the model
verifies every one, so a bad proposal costs speed, never correctness.
"""

from __future__ import annotations

from typing import Protocol

from hintkv.engine.sequence import Sequence


class Proposer(Protocol):
    num_speculative_tokens: int

    def propose(self, seq: Sequence, k: int) -> list[int]:
        """At most `k` token ids likely to follow `seq.token_ids` (may be empty)."""
        ...

    def on_finish(self, seq: Sequence) -> None:
        """`seq` has finished (or was aborted): drop its per-request state."""
        ...
