"""POST /v1/completions: a text or token-id prompt straight to the engine.

`agent_hint` works here as on chat completions (the benchmarks send token-id prompts with
session identities), except that a prompt has no messages or tools: range edits are a 400,
and a management request may leave the prompt out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from hintkv.protocol import AgentHintResult
from hintkv.server.admission import completion_prompt_ids
from hintkv.server.api_requests import CompletionRequest
from hintkv.server.api_responses import (
    SSE_DONE,
    CompletionChoice,
    CompletionResponse,
    HintkvMetrics,
    Usage,
    management_completion_response,
    sse_event,
)
from hintkv.server.errors import APIError, bad_request, error_body
from hintkv.server.generation import Finished, TextDelta
from hintkv.server.hints import RequestHint, completion_hint
from hintkv.server.serving import ApplyHint, Events, serve
from hintkv.server.state import require_api_key
from hintkv.server.streaming import final_response, json_response, sse_response

router = APIRouter()


class CompletionCall:
    """One /v1/completions request on the shared serving path (`serving.serve`)."""

    def __init__(self, body: CompletionRequest, raw: dict[str, Any],
                 headers: Mapping[str, str], tenant: str) -> None:
        self.body = body
        self.hinted: RequestHint | None = completion_hint(raw, headers, tenant)  # HintError: 400
        self.tokenizes = isinstance(body.prompt, str)  # (one prompt: the model's validator unwrapped it)

    def check_prompt(self) -> None:
        if self.body.prompt is None or len(self.body.prompt) == 0:
            raise bad_request("prompt: a non-empty prompt is required", param="prompt")

    def prompt_ids(self, tokenizer: Any) -> list[int]:
        return completion_prompt_ids(tokenizer, self.body)

    def apply_args(self, tokenizer: Any) -> dict[str, Any]:
        return {}

    def management_response(self, request_id: str, model: str, result: AgentHintResult) -> Response:
        resp = management_completion_response(request_id, model, result)
        if self.body.stream:
            return sse_response(_management_stream(resp))
        return json_response(resp)

    def stream(self, events: Events, request_id: str, model: str, prompt_ids: list[int],
               after: ApplyHint) -> AsyncIterator[str]:
        return _stream(events, request_id, model, prompt_ids, self.body, after)

    async def response(self, text: str, token_ids: list[int], fin: Finished, request_id: str,
                       model: str, prompt_ids: list[int], after: ApplyHint) -> Response:
        body = self.body
        choice = CompletionChoice(
            text=text,
            finish_reason=fin.finish_reason,
            token_ids=token_ids if body.return_token_ids else None,
        )
        return await final_response(CompletionResponse, choice, fin, request_id, model, prompt_ids,
                                    body.return_token_ids, after)


class CompletionEndpoint:
    request_model = CompletionRequest
    id_prefix = "cmpl"
    prompt_param = "prompt"

    def call(self, body: CompletionRequest, raw: dict[str, Any],
             headers: Mapping[str, str], tenant: str) -> CompletionCall:
        return CompletionCall(body, raw, headers, tenant)


ENDPOINT = CompletionEndpoint()


@router.post("/v1/completions", dependencies=[Depends(require_api_key)])
async def completions(request: Request) -> Response:
    return await serve(request, ENDPOINT)


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
                    ev.sending()  # before the yield: the client may read the chunk before we resume
                    yield sse_event(out)
                    continue
                last = chunk("", finish_reason=ev.finish_reason)
                if ev.times is not None:
                    ev.times.sending()  # (when no delta went out, this last chunk is the first)
                last.agent_hint_result = await after_generation()
                last.hintkv_metrics = HintkvMetrics.of(ev.metrics, ev.times)
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
