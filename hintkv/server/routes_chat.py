"""POST /v1/chat/completions: messages (and tools) through the chat template to the engine.

With tools, `<tool_call>` blocks in the output come back as OpenAI `tool_calls` (see
`tool_calls`); streamed, the content before a call flows as it is made and the calls
arrive whole, in one chunk, when the generation ends.

An `agent_hint` (or the x-session-id headers) attributes the request's KV to a session. A
management request (`manage_request: true`) generates nothing: its edits are applied and the
reply is an empty envelope plus `agent_hint_result`. Otherwise the edits are applied once the
generation has finished (its KV attributed), and the result rides on the final response (the
finish chunk of a stream).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from hintkv.protocol import AgentHintResult
from hintkv.server.admission import chat_prompt_ids
from hintkv.server.api_requests import ChatCompletionRequest
from hintkv.server.api_responses import (
    SSE_DONE,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    DeltaToolCall,
    HintkvMetrics,
    ToolCall,
    ToolCallFunction,
    Usage,
    management_chat_response,
    sse_event,
)
from hintkv.server.errors import APIError, bad_request, error_body
from hintkv.server.generation import Finished, TextDelta
from hintkv.server.hint_edits import chat_render
from hintkv.server.hints import RequestHint, chat_hint
from hintkv.server.serving import ApplyHint, Events, serve
from hintkv.server.state import require_api_key
from hintkv.server.streaming import final_response, json_response, sse_response
from hintkv.server.tool_calls import ParsedToolCall, ToolCallStreamer, parse_tool_calls

router = APIRouter()


class ChatCall:
    """One chat request on the shared serving path (`serving.serve`)."""

    def __init__(self, body: ChatCompletionRequest, raw: dict[str, Any],
                 headers: Mapping[str, str], tenant: str) -> None:
        self.body = body
        self.messages = body.template_messages()
        self.hinted: RequestHint | None = chat_hint(raw, headers, self.messages, body.tools, tenant)
        self.tokenizes = True  # the chat template, then the tokenizer

    def check_prompt(self) -> None:
        if not self.body.messages:
            raise bad_request("messages: List should have at least 1 item, not 0", param="messages")

    def prompt_ids(self, tokenizer: Any) -> list[int]:
        return chat_prompt_ids(tokenizer, self.body)

    def apply_args(self, tokenizer: Any) -> dict[str, Any]:
        render = chat_render(tokenizer, self.body.chat_template_kwargs)
        return {"render": render, "messages": self.messages, "tools": self.body.tools}

    def management_response(self, request_id: str, model: str, result: AgentHintResult) -> Response:
        resp = management_chat_response(request_id, model, result)
        if self.body.stream:
            return sse_response(_management_stream(resp))
        return json_response(resp)

    def stream(self, events: Events, request_id: str, model: str, prompt_ids: list[int],
               after: ApplyHint) -> AsyncIterator[str]:
        return _stream(events, request_id, model, prompt_ids, self.body, after)

    async def response(self, text: str, token_ids: list[int], fin: Finished, request_id: str,
                       model: str, prompt_ids: list[int], after: ApplyHint) -> Response:
        body = self.body
        content, calls = parse_tool_calls(text) if body.uses_tools else (text, [])
        calls = body.returned_calls(calls)
        message = AssistantMessage(
            content=(content or None) if calls else content,
            tool_calls=[ToolCall(id=c.id, function=_function(c)) for c in calls] or None,
        )
        choice = ChatChoice(
            message=message,
            finish_reason="tool_calls" if calls else fin.finish_reason,
            token_ids=token_ids if body.return_token_ids else None,
        )
        return await final_response(ChatCompletionResponse, choice, fin, request_id, model, prompt_ids,
                                    body.return_token_ids, after)


class ChatEndpoint:
    request_model = ChatCompletionRequest
    id_prefix = "chatcmpl"
    prompt_param = "messages"

    def call(self, body: ChatCompletionRequest, raw: dict[str, Any],
             headers: Mapping[str, str], tenant: str) -> ChatCall:
        return ChatCall(body, raw, headers, tenant)


ENDPOINT = ChatEndpoint()


@router.post("/v1/chat/completions", dependencies=[Depends(require_api_key)])
async def chat_completions(request: Request) -> Response:
    return await serve(request, ENDPOINT)


async def _management_stream(resp: ChatCompletionResponse) -> AsyncIterator[str]:
    """A management reply for a client that asked for a stream: one empty turn, then [DONE]."""
    first = ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))
    yield sse_event(ChatCompletionChunk(id=resp.id, model=resp.model, choices=[first]))
    last = ChatChunkChoice(delta=ChatDelta(), finish_reason="stop")
    yield sse_event(
        ChatCompletionChunk(
            id=resp.id, model=resp.model, choices=[last], agent_hint_result=resp.agent_hint_result
        )
    )
    yield SSE_DONE


def _function(call: ParsedToolCall) -> ToolCallFunction:
    return ToolCallFunction(name=call.name, arguments=call.arguments)


async def _stream(
    events: AsyncIterator[TextDelta | Finished],
    request_id: str,
    model: str,
    prompt_ids: list[int],
    body: ChatCompletionRequest,
    after_generation: Callable[[], Awaitable[AgentHintResult | None]],
) -> AsyncIterator[str]:
    def chunk(delta: ChatDelta, **choice: object) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=request_id, model=model, choices=[ChatChunkChoice(delta=delta, **choice)]
        )

    first = chunk(ChatDelta(role="assistant", content=""))
    if body.return_token_ids:
        first.prompt_token_ids = prompt_ids
    yield sse_event(first)
    tools = ToolCallStreamer() if body.uses_tools else None
    async with aclosing(events) as stream:
        try:
            async for ev in stream:
                if isinstance(ev, TextDelta):
                    text = tools.feed(ev.text) if tools is not None else ev.text
                    if not text and not body.return_token_ids:
                        continue  # held back (stop string, tool call, half a character)
                    ids = ev.token_ids if body.return_token_ids else None
                    ev.sending()  # before the yield: the client may read the chunk before we resume
                    yield sse_event(chunk(ChatDelta(content=text), token_ids=ids))
                    continue
                rest, calls = tools.finish() if tools is not None else ("", [])
                calls = body.returned_calls(calls)
                if ev.times is not None:
                    ev.times.sending()  # (when no delta went out, the chunks below or the last are the first)
                if rest:
                    yield sse_event(chunk(ChatDelta(content=rest)))
                if calls:
                    deltas = [
                        DeltaToolCall(index=i, id=c.id, function=_function(c))
                        for i, c in enumerate(calls)
                    ]
                    yield sse_event(chunk(ChatDelta(tool_calls=deltas)))
                reason = "tool_calls" if calls else ev.finish_reason
                last = chunk(ChatDelta(), finish_reason=reason)
                last.agent_hint_result = await after_generation()
                last.hintkv_metrics = HintkvMetrics.of(ev.metrics, ev.times)
                yield sse_event(last)
                if body.include_usage:
                    usage = Usage.of(
                        ev.num_prompt_tokens, ev.num_output_tokens, ev.num_cached_tokens
                    )
                    yield sse_event(
                        ChatCompletionChunk(id=request_id, model=model, choices=[], usage=usage)
                    )
        except APIError as err:
            yield sse_event(error_body(err.message, err.type, err.param, err.code))
    yield SSE_DONE
