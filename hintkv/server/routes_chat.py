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

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

from fastapi import APIRouter, Depends, Request, Response

from hintkv.protocol import AgentHintResult
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
    management_chat_response,
    sse_event,
)
from hintkv.server.body import parse_body
from hintkv.server.errors import APIError, bad_request, error_body
from hintkv.server.generation import Finished, TextDelta, collect_text, generate_text
from hintkv.server.hint_edits import apply_hint, chat_render
from hintkv.server.hints import RequestHint, chat_hint
from hintkv.server.state import ServerState, request_tenant, require_api_key, server_state
from hintkv.server.streaming import ClientDisconnected, cancel_on_disconnect, sse_response
from hintkv.server.tool_calls import ParsedToolCall, ToolCallStreamer, parse_tool_calls

router = APIRouter()


@router.post("/v1/chat/completions", dependencies=[Depends(require_api_key)])
async def chat_completions(request: Request) -> Response:
    arrival = time.perf_counter()
    body, raw = await parse_body(request, ChatCompletionRequest)
    state = server_state(request)
    engine = state.engine
    check_model(body.model, engine.model_name)
    check_supported(body)
    messages = body.template_messages()
    tenant = request_tenant(request, body.cache_salt)
    hinted = chat_hint(raw, request.headers, messages, body.tools, tenant)  # HintError: 400
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    if hinted is not None and hinted.manage:
        result = await _apply(state, hinted, body, messages)
        resp = management_chat_response(request_id, engine.model_name, result)
        state.metrics.manage_latency.observe(time.perf_counter() - arrival)
        if body.stream:
            return sse_response(_management_stream(resp))
        return Response(resp.model_dump_json(), media_type="application/json")
    if not body.messages:
        raise bad_request("messages: List should have at least 1 item, not 0", param="messages")
    prompt_ids = chat_prompt_ids(engine.tokenizer, body)
    output_param = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    gen_req = generate_request(
        engine,
        request_id,
        prompt_ids,
        body,
        prompt_param="messages",
        output_limit=body.output_limit,
        output_param=output_param,
        session=hinted.ref if hinted is not None and state.hints else None,
        tenant=tenant,
    )
    state.metrics.prompt_tokens.inc(len(prompt_ids))
    events = generate_text(engine, gen_req, body.stop_strings, state.metrics, arrival)

    async def after_generation() -> AgentHintResult | None:
        if hinted is None or not hinted.edits:
            return None
        return await _apply(state, hinted, body, messages)

    if body.stream:
        return sse_response(
            _stream(events, request_id, engine.model_name, prompt_ids, body, after_generation)
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
        id=request_id,
        model=engine.model_name,
        choices=[choice],
        usage=Usage.of(fin.num_prompt_tokens, fin.num_output_tokens, fin.num_cached_tokens),
        prompt_token_ids=prompt_ids if body.return_token_ids else None,
        agent_hint_result=await after_generation(),
    )
    return Response(resp.model_dump_json(), media_type="application/json")


async def _apply(
    state: ServerState, hinted: RequestHint, body: ChatCompletionRequest, messages: list[dict]
) -> AgentHintResult:
    return await apply_hint(
        state.engine,
        hinted,
        enabled=state.hints,
        metrics=state.metrics,
        render=chat_render(state.engine.tokenizer, body.chat_template_kwargs),
        messages=messages,
        tools=body.tools,
    )


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
                last = chunk(ChatDelta(), finish_reason=reason)
                last.agent_hint_result = await after_generation()
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
