"""What crosses the step's two seams: scheduler -> model runner -> scheduler.

    schedule() -> SchedulerOutput -> runner -> ModelRunnerOutput -> update_from_output() -> [RequestOutput]

Both are plain data, so the scheduler can be driven without a model: a simulator (or a test)
reads `SchedulerOutput.scheduled`, makes up a `ModelRunnerOutput` with one list of token ids per
scheduled sequence, and hands both back to `Scheduler.update_from_output`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hintkv.engine.sequence import Sequence


@dataclass(slots=True)
class ScheduledSeq:
    """One sequence's share of a step. Its new tokens, by position:

        | computed (num_computed_tokens) | new: num_new_tokens - num_spec_tokens | drafts: num_spec_tokens |

    Drafts (speculative decoding) are proposed tokens after the last real one; the runner
    verifies them in the same forward and reports how many it accepted.
    """

    seq: Sequence
    num_new_tokens: int  # tokens whose KV this step computes (real tokens + drafts)
    spec_token_ids: list[int] = field(default_factory=list)  # drafts after seq.token_ids

    @property
    def num_spec_tokens(self) -> int:
        return len(self.spec_token_ids)

    @property
    def samples(self) -> bool:
        """True when this step completes the sequence's KV, so its next token is sampled."""
        return (self.seq.num_computed_tokens + self.num_new_tokens - self.num_spec_tokens
                == self.seq.num_tokens)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    out_of_room: list[Sequence] = field(default_factory=list)  # alone and still no room: finish
    started: float = 0.0  # the scheduler's clock when the step was scheduled
    write_down_mark: int = 0  # victims queued for a write-down by then: flushed before the forward
    # waiting sequences this step left waiting for room: the ones the room rule (or the blocks)
    # refused, and when that stopped the admissions, every one behind it (the simulator's `queue_why`)
    num_room_waits: int = 0

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


@dataclass(slots=True)
class ModelRunnerOutput:
    """What one forward produced, index-aligned with `SchedulerOutput.scheduled`.

    `sampled_token_ids[i]` is empty when sequence i's step was a prefill chunk that does not reach
    its last token; otherwise it holds the sampled token, or with drafts the accepted drafts
    followed by one more sampled token (so 1 .. num_spec_tokens + 1 ids).
    """

    sampled_token_ids: list[list[int]] = field(default_factory=list)
    forward_s: float | None = None  # time the forward took (wall or simulated): feeds cost models

    @classmethod
    def from_tokens(cls, tokens: list[int | None], forward_s: float | None = None) -> ModelRunnerOutput:
        """One token (or None: nothing sampled) per scheduled sequence."""
        return cls([[] if t is None else [t] for t in tokens], forward_s)

