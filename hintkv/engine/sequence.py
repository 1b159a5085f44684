"""A request's state inside the engine: its tokens, how far its KV is computed, its blocks.

Plain data: the scheduler and the cache read and write it; no tensors (the sampling generator
and the penalties' token tally are carried for the model runner).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hintkv.cache.block import Block
from hintkv.cache.hashing import BlockHash
from hintkv.engine.types import FinishReason, SamplingParams, SessionRef, TtftParts

if TYPE_CHECKING:  # the scheduler side never needs torch; only the runner reads the generator and tally
    import torch

    from hintkv.engine.logits_shaping import TokenTally


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # not admitted yet, or preempted (its KV freed, to be recomputed)
    LOADING = "loading"  # admitted; waiting for prefix KV to arrive from a lower tier
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]  # prompt + generated so far
    num_prompt_tokens: int
    sampling: SamplingParams
    root_hash: BlockHash  # namespace of this request's KV (model, dtype, layout, cache_salt)
    session: SessionRef | None = None
    session_key: str | None = None  # registry key when hints are on
    arrival: float = 0.0  # the scheduler's clock when the request arrived
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the block table
    block_table: list[Block] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)  # of full blocks, in order
    num_registered_blocks: int = 0  # leading blocks of block_table already in the prefix index
    num_cached_tokens: int = 0  # prefix hit at first admission (reported as cached_tokens)
    num_preemptions: int = 0
    admitted_once: bool = False
    loading_counts_as_hit: bool = False  # the pending lower-tier load is this request's first hit
    generator: torch.Generator | None = None
    token_tally: TokenTally | None = None  # the runner's penalty state (engine/logits_shaping.py)
    finish_reason: FinishReason | None = None
    num_sent_tokens: int = 0  # output tokens already returned to the caller
    # per-request metrics (scheduler clock): first / latest output token, peak blocks, drafts
    first_token_time: float | None = None
    last_token_time: float | None = None
    peak_kv_blocks: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    ttft: TtftParts = field(default_factory=TtftParts)  # where the time to first token goes
    ttft_mark: float = 0.0  # the clock up to which `ttft` has accounted

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_computed_tokens < self.num_tokens - 1

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]
