"""POST /v1/chat/completions: messages (and tools) through the chat template to the engine."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter, Depends, Request, Response

from hintkv.server.admission import chat_prompt_ids, check_model, generate_request
from hintkv.server.api_requests import ChatCompletionRequest
from hintkv.server.api_responses import (
    SSE_DONE,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    Usage,
    sse_event,
)
from hintkv.server.body import parse_body
from hintkv.server.errors import APIError, error_body
from hintkv.server.generation import Finished, TextDelta, collect_text, generate_text
from hintkv.server.state import require_api_key, server_state
from hintkv.server.streaming import ClientDisconnected, cancel_on_disconnect, sse_response

router = APIRouter()


@router.post("/v1/chat/completions", dependencies=[Depends(require_api_key)])
async def chat_completions(request: Request) -> Response:
    arrival = time.perf_counter()
    body, _raw = await parse_body(request, ChatCompletionRequest)
    state = server_state(request)
    engine = state.engine
    check_model(body.model, engine.model_name)
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
    choice = ChatChoice(
        message=AssistantMessage(content=text),
        finish_reason=fin.finish_reason,
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
    async with aclosing(events) as stream:
        try:
            async for ev in stream:
                if isinstance(ev, TextDelta):
                    if not ev.text and not body.return_token_ids:
                        continue  # held back (stop string or half a character): nothing to send
                    ids = ev.token_ids if body.return_token_ids else None
                    yield sse_event(chunk(ChatDelta(content=ev.text), token_ids=ids))
                    continue
                yield sse_event(chunk(ChatDelta(), finish_reason=ev.finish_reason))
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
