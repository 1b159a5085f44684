"""POST /v1/completions: a text or token-id prompt straight to the engine.

`agent_hint` works here as on chat completions (the benchmarks send token-id prompts with
session identities), except that a prompt has no messages or tools: range edits are a 400,
and a management request may leave the prompt out.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

from fastapi import APIRouter, Depends, Request, Response

from hintkv.protocol import AgentHintResult
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
    management_completion_response,
    sse_event,
)
from hintkv.server.body import parse_body
from hintkv.server.errors import APIError, bad_request, error_body
from hintkv.server.generation import Finished, TextDelta, collect_text, generate_text
from hintkv.server.hint_edits import apply_hint
from hintkv.server.hints import completion_hint
from hintkv.server.state import request_tenant, require_api_key, server_state
from hintkv.server.streaming import ClientDisconnected, cancel_on_disconnect, sse_response

router = APIRouter()


@router.post("/v1/completions", dependencies=[Depends(require_api_key)])
async def completions(request: Request) -> Response:
    arrival = time.perf_counter()
    body, raw = await parse_body(request, CompletionRequest)
    state = server_state(request)
    engine = state.engine
    check_model(body.model, engine.model_name)
    check_supported(body)
    tenant = request_tenant(request, body.cache_salt)
    hinted = completion_hint(raw, request.headers, tenant)  # HintError: 400
    request_id = f"cmpl-{uuid.uuid4().hex}"

    async def apply() -> AgentHintResult:
        return await apply_hint(engine, hinted, enabled=state.hints, metrics=state.metrics)

    if hinted is not None and hinted.manage:
        resp = management_completion_response(request_id, engine.model_name, await apply())
        state.metrics.manage_latency.observe(time.perf_counter() - arrival)
        if body.stream:
            return sse_response(_management_stream(resp))
        return Response(resp.model_dump_json(), media_type="application/json")
    if body.prompt is None or len(body.prompt) == 0:
        raise bad_request("prompt: a non-empty prompt is required", param="prompt")
    prompt_ids = completion_prompt_ids(engine.tokenizer, body)
    gen_req = generate_request(
        engine,
        request_id,
        prompt_ids,
        body,
        prompt_param="prompt",
        output_limit=body.output_limit,
        output_param="max_tokens",
        session=hinted.ref if hinted is not None and state.hints else None,
        tenant=tenant,
    )
    state.metrics.prompt_tokens.inc(len(prompt_ids))
    events = generate_text(engine, gen_req, body.stop_strings, state.metrics, arrival)

    async def after_generation() -> AgentHintResult | None:
        return await apply() if hinted is not None and hinted.edits else None

    if body.stream:
        return sse_response(
            _stream(events, request_id, engine.model_name, prompt_ids, body, after_generation)
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
        id=request_id,
        model=engine.model_name,
        choices=[choice],
        usage=Usage.of(fin.num_prompt_tokens, fin.num_output_tokens, fin.num_cached_tokens),
        prompt_token_ids=prompt_ids if body.return_token_ids else None,
        agent_hint_result=await after_generation(),
    )
    return Response(resp.model_dump_json(), media_type="application/json")


async def _management_stream(resp: CompletionResponse) -> AsyncIterator[str]:
    yield sse_event(resp)
    yield SSE_DONE


async def _stream(
    events: AsyncIterator[TextDelta | Finished],
    request_id: str,
    model: str,
    prompt_ids: list[int],
    body: CompletionRequest,
    after_generation: Callable[[], Awaitable[AgentHintResult | None]],
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
                last = chunk("", finish_reason=ev.finish_reason)
                last.agent_hint_result = await after_generation()
                yield sse_event(last)
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
