"""The OpenAI response bodies we send: whole responses, stream chunks, usage, model list.

Responses to a request carrying Agent Hint edits add one field, `agent_hint_result`
(hintkv.protocol.result), next to the standard ones; it is left out everywhere else.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from hintkv.engine.types import RequestMetrics
from hintkv.protocol import AgentHintResult
from hintkv.server.serve_times import ServeTimes


def _now() -> int:
    return int(time.time())


def _omitted_if_none(description: str) -> Any:
    """An optional field that is left out of the JSON, not sent as null, when unset."""
    return Field(None, exclude_if=lambda v: v is None, description=description)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, num_prompt: int, num_output: int, num_cached: int) -> Usage:
        return cls(
            prompt_tokens=num_prompt,
            completion_tokens=num_output,
            total_tokens=num_prompt + num_output,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=num_cached),
        )


class HintkvMetrics(BaseModel):
    """Extension field `hintkv_metrics`: the request's own figures, on the engine's clock from its
    arrival at the scheduler (docs/protocol.md)."""

    ttft_s: float | None
    e2e_s: float
    inter_token_latency_s: float | None
    decode_tokens_per_s: float | None
    peak_kv_blocks: int
    spec_draft_tokens: int
    spec_accepted_tokens: int
    spec_acceptance: float | None
    ttft_parts: dict[str, float] | None = None  # queue_s, load_s, blocked_s, shared_s, compute_s
    # the server's parts around the engine's TTFT (server/serve_times.py): http_s, inbox_s, wake_s,
    # stream_s and their sum with ttft_s, serve_s (the handler's start -> the first chunk out)
    serve_parts: dict[str, float] | None = None

    @classmethod
    def of(cls, m: RequestMetrics | None, times: ServeTimes | None = None) -> HintkvMetrics | None:
        if m is None:
            return None
        return cls(ttft_s=m.ttft_s, e2e_s=m.e2e_s, inter_token_latency_s=m.itl_s,
                   decode_tokens_per_s=m.decode_tokens_per_s, peak_kv_blocks=m.peak_kv_blocks,
                   spec_draft_tokens=m.num_draft_tokens, spec_accepted_tokens=m.num_accepted_tokens,
                   spec_acceptance=m.acceptance,
                   ttft_parts=None if m.ttft_parts is None else m.ttft_parts.as_dict(),
                   serve_parts=None if times is None else times.parts(m))


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class DeltaToolCall(ToolCall):
    index: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = _omitted_if_none("only when the model called tools")


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _omitted_if_none("extension: return_token_ids")


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = _omitted_if_none("extension: return_token_ids")
    agent_hint_result: AgentHintResult | None = _omitted_if_none("extension: hint edits applied")
    hintkv_metrics: HintkvMetrics | None = _omitted_if_none("extension: per-request figures (last chunk)")


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = _omitted_if_none("only in the first chunk")
    content: str | None = _omitted_if_none("absent in the last chunk")
    tool_calls: list[DeltaToolCall] | None = _omitted_if_none("only when the model called tools")


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _omitted_if_none("extension: return_token_ids")


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = _omitted_if_none("extension: return_token_ids")
    agent_hint_result: AgentHintResult | None = _omitted_if_none("extension: hint edits applied")
    hintkv_metrics: HintkvMetrics | None = _omitted_if_none("extension: per-request figures (last chunk)")


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = _omitted_if_none("extension: return_token_ids")


class CompletionResponse(BaseModel):
    """A whole completion, or one chunk of a streamed one (OpenAI uses the same object)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = _omitted_if_none("extension: return_token_ids")
    agent_hint_result: AgentHintResult | None = _omitted_if_none("extension: hint edits applied")
    hintkv_metrics: HintkvMetrics | None = _omitted_if_none("extension: per-request figures (last chunk)")


def management_chat_response(request_id: str, model: str, result: AgentHintResult) -> ChatCompletionResponse:
    """The reply to a management request: a valid envelope that generated nothing."""
    return ChatCompletionResponse(
        id=request_id,
        model=model,
        choices=[ChatChoice(message=AssistantMessage(content=""), finish_reason="stop")],
        usage=Usage.of(0, 0, 0),
        agent_hint_result=result,
    )


def management_completion_response(
    request_id: str, model: str, result: AgentHintResult
) -> CompletionResponse:
    return CompletionResponse(
        id=request_id,
        model=model,
        choices=[CompletionChoice(text="", finish_reason="stop")],
        usage=Usage.of(0, 0, 0),
        agent_hint_result=result,
    )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "hintkv"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def sse_event(payload: BaseModel | dict[str, Any]) -> str:
    body = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {body}\n\n"


SSE_DONE = "data: [DONE]\n\n"
