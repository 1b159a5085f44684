"""`EngineClient`: everything the server may ask of an engine, in one place.

The server is typed against this protocol and never reaches behind it (no scheduler, no cache,
no private fields); `AsyncLLM` implements it. Calls that touch engine state are async and run on
the engine's side; the attributes are fixed when the engine is built.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol, runtime_checkable

from hintkv.engine.types import (
    CacheEdit,
    EditOutcome,
    EngineStats,
    GenerateRequest,
    RequestMetrics,
    RequestOutput,
    SessionDescription,
    SessionRef,
)
from hintkv.models.tokenizer import Tokenizer


@runtime_checkable
class EngineClient(Protocol):
    model_name: str  # the served model name (requests must name it)
    tokenizer: Tokenizer  # the model's tokenizer and chat template
    max_model_len: int  # context length: prompt + output tokens per request
    num_kv_tokens: int  # device KV pool size in tokens
    hints: bool  # Agent Hints are acted on (False: --ignore-hints)
    max_num_seqs: int  # sequences the engine runs at once (the server sizes its queue by it)
    num_integrity_violations: int  # failed `verify_integrity` checks so far

    def generate(self, req: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; the last has `finished=True`. Closing the iterator early
        aborts the request and frees its KV. A request the engine refuses raises ValueError."""
        ...

    def abort(self, request_id: str) -> Awaitable[RequestMetrics | None]:
        """Stop a request if it still runs (its session keeps what it computed). Queued at the call, before
        whatever is asked after it (closing the request's `generate`); awaits its figures so far, None if it
        had finished or is unknown."""
        ...

    async def manage(self, ref: SessionRef, edits: list[CacheEdit]) -> list[EditOutcome]:
        """Apply Agent Hint edits to a session's KV; one outcome per edit, in order."""
        ...

    async def describe_session(self, tenant: str, session_id: str) -> SessionDescription | None:
        """A session's cache state, or None when this tenant has no such session."""
        ...

    def stats(self) -> EngineStats:
        """Scheduler and pool figures now (cheap; called at every /metrics scrape)."""
        ...

    def tier_stats(self) -> dict[str, Any]:
        """KV tier counters (shape: `LLMEngine.tier_stats`)."""
        ...

    async def check_integrity(self) -> None:
        """Assert every invariant of the engine's state (tests, debugging)."""
        ...

    async def verify_integrity(self) -> bool:
        """Like `check_integrity`, but a violation is counted and logged, not raised."""
        ...

    async def sweep_sessions(self) -> int:
        """Forget ended, idle and over-cap sessions (bounded state); how many were forgotten."""
        ...

    async def shutdown(self) -> None:
        ...
