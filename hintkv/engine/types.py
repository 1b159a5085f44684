"""The contract between the server and the engine: what a request asks for, what comes back.

The server builds a `GenerateRequest` (token ids, sampling, cache namespace, session identity)
and reads a stream of `RequestOutput`s; it never touches the scheduler or the cache directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from hintkv.cache.types import (  # noqa: F401  (re-exported)
    CacheEdit,
    EditOutcome,
    SessionDescription,
    SessionRef,
)

FinishReason = Literal["stop", "length", "abort"]

# Below this a temperature samples as greedy: logits / t would overflow float32 into NaN.
MIN_TEMPERATURE = 1e-5
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # in addition to the model's EOS ids
    ignore_eos: bool = False
    # vLLM's and OpenAI's further knobs (engine/logits_shaping.py applies the first five, `probs` the last two)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many outputs
    repetition_penalty: float = 1.0  # > 1 discourages every token of the prompt and output so far
    frequency_penalty: float = 0.0  # subtracted once per earlier occurrence in the output
    presence_penalty: float = 0.0  # subtracted once if the token occurs in the output
    top_k: int = 0  # 0 (or -1): every token
    min_p: float = 0.0  # drop tokens below min_p x the most likely one's probability

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError("temperature must be finite and >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ValueError(f"seed must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must be in [0, max_tokens]")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError("repetition_penalty must be finite and > 0")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2]")
        if self.top_k < -1:
            raise ValueError("top_k must be -1, 0 (off) or >= 1")
        if not 0 <= self.min_p <= 1:
            raise ValueError("min_p must be in [0, 1]")
        if any(t < 0 or not -100 <= b <= 100 for t, b in self.logit_bias):
            raise ValueError("logit_bias maps token ids >= 0 to values in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    @property
    def shapes_logits(self) -> bool:
        """Whether its logits depend on more than the model (bias, min_tokens, penalties): such a request
        takes no argmax shortcut and no drafts (a draft would change the counts its next row reads)."""
        return bool(self.logit_bias or self.min_tokens or self.repetition_penalty != 1.0
                    or self.frequency_penalty or self.presence_penalty)


@dataclass(slots=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    cache_salt: str | None = None  # different salts never share KV blocks
    session: SessionRef | None = None


@dataclass(slots=True)
class TtftParts:
    """Where a request's time to first token went, on the engine's clock; the parts sum to its
    `ttft_s`. A step's forward time is split among the sequences in it by their new tokens."""

    queue_s: float = 0.0  # waiting for admission (also after a preemption)
    load_s: float = 0.0  # admitted, its prefix KV arriving from a lower tier
    blocked_s: float = 0.0  # admitted, not in the forward pass: the steps went to others (+ the loop)
    shared_s: float = 0.0  # in a forward pass: the other sequences' share of it
    compute_s: float = 0.0  # in a forward pass: its own tokens' share (its uncached prefill)

    FIELDS = ("queue_s", "load_s", "blocked_s", "shared_s", "compute_s")

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.FIELDS}


@dataclass(slots=True)
class RequestMetrics:
    """What one request cost, measured on the engine's clock from its arrival at the scheduler
    (tokenizing and HTTP excluded). Reported when it finishes."""

    ttft_s: float | None  # arrival -> first generated token (None: aborted before one)
    e2e_s: float  # arrival -> finish
    itl_s: float | None  # mean gap between output tokens after the first (None: < 2 tokens)
    decode_tokens_per_s: float | None  # output tokens after the first / time since the first
    peak_kv_blocks: int  # most device KV blocks the request held at once
    num_draft_tokens: int = 0  # speculative drafts verified
    num_accepted_tokens: int = 0  # of which accepted
    ttft_parts: TtftParts | None = None  # where the TTFT went (None: no first token)
    # set by the async front end (`AsyncLLM`), not the scheduler: the request's wait in the engine
    # thread's inbox and in `add_request` (the running step, then the state lock), perf_counter s
    inbox_s: float | None = None

    @property
    def acceptance(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None


@dataclass(slots=True)
class RequestOutput:
    """One increment of a request's result; the last one has `finished=True`."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (any tier)
    num_output_tokens: int = 0
    error: str | None = None  # set when the engine could not serve the request at all
    metrics: RequestMetrics | None = None  # on the finished output



@dataclass(slots=True)
class EngineStats:
    """Scheduler and device-pool figures at one moment (for /metrics)."""

    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_blocks_total: int
    kv_blocks_in_use: int
    kv_blocks_cached: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
