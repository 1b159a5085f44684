"""POST /v1/completions: a text or token-id prompt straight to the engine."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter, Depends, Request, Response

from hintkv.server.admission import (
    check_model,
    check_supported,
    completion_prompt_ids,
    generate_request,
)
from hintkv.server.api_requests import CompletionRequest
from hintkv.server.api_responses import (
    SSE_DONE,
    CompletionChoice,
    CompletionResponse,
    Usage,
    sse_event,
)
from hintkv.server.body import parse_body
from hintkv.server.errors import APIError, error_body
from hintkv.server.generation import Finished, TextDelta, collect_text, generate_text
from hintkv.server.state import require_api_key, server_state
from hintkv.server.streaming import ClientDisconnected, cancel_on_disconnect, sse_response

router = APIRouter()


@router.post("/v1/completions", dependencies=[Depends(require_api_key)])
async def completions(request: Request) -> Response:
    arrival = time.perf_counter()
    body, _raw = await parse_body(request, CompletionRequest)
    state = server_state(request)
    engine = state.engine
    check_model(body.model, engine.model_name)
    check_supported(body)
    prompt_ids = completion_prompt_ids(engine.tokenizer, body)
    gen_req = generate_request(
        engine,
        f"cmpl-{uuid.uuid4().hex}",
        prompt_ids,
        body,
        prompt_param="prompt",
        output_limit=body.output_limit,
        output_param="max_tokens",
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
    choice = CompletionChoice(
        text=text,
        finish_reason=fin.finish_reason,
        token_ids=token_ids if body.return_token_ids else None,
    )
    resp = CompletionResponse(
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
    body: CompletionRequest,
) -> AsyncIterator[str]:
    def chunk(text: str, **choice: object) -> CompletionResponse:
        return CompletionResponse(
            id=request_id, model=model, choices=[CompletionChoice(text=text, **choice)]
        )

    sent_prompt_ids = not body.return_token_ids
    async with aclosing(events) as stream:
        try:
            async for ev in stream:
                if isinstance(ev, TextDelta):
                    if not ev.text and not body.return_token_ids:
                        continue  # held back (stop string or half a character): nothing to send
                    out = chunk(ev.text, token_ids=ev.token_ids if body.return_token_ids else None)
                    if not sent_prompt_ids:
                        out.prompt_token_ids, sent_prompt_ids = prompt_ids, True
                    yield sse_event(out)
                    continue
                yield sse_event(chunk("", finish_reason=ev.finish_reason))
                if body.include_usage:
                    usage = Usage.of(
                        ev.num_prompt_tokens, ev.num_output_tokens, ev.num_cached_tokens
                    )
                    yield sse_event(
                        CompletionResponse(id=request_id, model=model, choices=[], usage=usage)
                    )
        except APIError as err:
            yield sse_event(error_body(err.message, err.type, err.param, err.code))
    yield SSE_DONE
