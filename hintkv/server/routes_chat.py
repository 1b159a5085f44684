"""POST /v1/chat/completions: messages (and tools) through the chat template to the engine.

With tools, `<tool_call>` blocks in the output come back as OpenAI `tool_calls` (see
`tool_calls`); streamed, the content before a call flows as it is made and the calls
arrive whole, in one chunk, when the generation ends.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter, Depends, Request, Response

from hintkv.server.admission import chat_prompt_ids, check_model, check_supported, generate_request
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
    ToolCall,
    ToolCallFunction,
    Usage,
    sse_event,
)
from hintkv.server.body import parse_body
from hintkv.server.errors import APIError, error_body
from hintkv.server.generation import Finished, TextDelta, collect_text, generate_text
from hintkv.server.state import require_api_key, server_state
from hintkv.server.streaming import ClientDisconnected, cancel_on_disconnect, sse_response
from hintkv.server.tool_calls import ParsedToolCall, ToolCallStreamer, parse_tool_calls

router = APIRouter()


@router.post("/v1/chat/completions", dependencies=[Depends(require_api_key)])
async def chat_completions(request: Request) -> Response:
    arrival = time.perf_counter()
    body, _raw = await parse_body(request, ChatCompletionRequest)
    state = server_state(request)
    engine = state.engine
    check_model(body.model, engine.model_name)
    check_supported(body)
    prompt_ids = chat_prompt_ids(engine.tokenizer, body)
    output_param = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    gen_req = generate_request(
        engine,
        f"chatcmpl-{uuid.uuid4().hex}",
        prompt_ids,
        body,
        prompt_param="messages",
        output_limit=body.output_limit,
        output_param=output_param,
    )
    state.metrics.prompt_tokens.inc(len(prompt_ids))
    events = generate_text(engine, gen_req, body.stop_strings, state.metrics, arrival)
    if body.stream:
        return sse_response(
            _stream(events, gen_req.request_id, engine.model_name, prompt_ids, body)
        )
    try:
        text, token_ids, fin = await cancel_on_disconnect(request, collect_text(events))
    except ClientDisconnected:
        return Response(status_code=499)
    content, calls = parse_tool_calls(text) if body.uses_tools else (text, [])
    message = AssistantMessage(
        content=(content or None) if calls else content,
        tool_calls=[ToolCall(id=c.id, function=_function(c)) for c in calls] or None,
    )
    choice = ChatChoice(
        message=message,
        finish_reason="tool_calls" if calls else fin.finish_reason,
        token_ids=token_ids if body.return_token_ids else None,
    )
    resp = ChatCompletionResponse(
        id=gen_req.request_id,
        model=engine.model_name,
        choices=[choice],
        usage=Usage.of(fin.num_prompt_tokens, fin.num_output_tokens, fin.num_cached_tokens),
        prompt_token_ids=prompt_ids if body.return_token_ids else None,
    )
    return Response(resp.model_dump_json(), media_type="application/json")


def _function(call: ParsedToolCall) -> ToolCallFunction:
    return ToolCallFunction(name=call.name, arguments=call.arguments)


async def _stream(
    events: AsyncIterator[TextDelta | Finished],
    request_id: str,
    model: str,
    prompt_ids: list[int],
    body: ChatCompletionRequest,
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
                    yield sse_event(chunk(ChatDelta(content=text), token_ids=ids))
                    continue
                rest, calls = tools.finish() if tools is not None else ("", [])
                if rest:
                    yield sse_event(chunk(ChatDelta(content=rest)))
                if calls:
                    deltas = [
                        DeltaToolCall(index=i, id=c.id, function=_function(c))
                        for i, c in enumerate(calls)
                    ]
                    yield sse_event(chunk(ChatDelta(tool_calls=deltas)))
                reason = "tool_calls" if calls else ev.finish_reason
                yield sse_event(chunk(ChatDelta(), finish_reason=reason))
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
