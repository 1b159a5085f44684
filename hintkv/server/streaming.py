"""Getting results to the client: JSON and SSE responses (`final_response` builds the one
non-streamed reply both completion routes send), and cancelling work whose client has left.

A streamed response notices a departed client itself: Starlette cancels the task that feeds
the stream. A non-streamed one would keep the engine busy until the end, so its work runs
next to a watcher of `http.disconnect` and is cancelled when the client goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from hintkv.protocol import AgentHintResult
from hintkv.server.api_responses import HintkvMetrics, Usage
from hintkv.server.generation import Finished

T = TypeVar("T")

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientDisconnected(Exception):
    """The client went away before its response was ready."""


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS)


def json_response(resp: BaseModel) -> Response:
    return Response(resp.model_dump_json(), media_type="application/json")


async def final_response(
    response_model: type[BaseModel], choice: Any, fin: Finished, request_id: str, model: str,
    prompt_ids: list[int], return_token_ids: bool,
    after: Callable[[], Awaitable[AgentHintResult | None]],
) -> Response:
    """The non-streamed reply of a finished generation (chat or completion: `response_model`
    and its `choice` differ); `after()` applies the request's edits once the KV is attributed."""
    resp = response_model(
        id=request_id,
        model=model,
        choices=[choice],
        usage=Usage.of(fin.num_prompt_tokens, fin.num_output_tokens, fin.num_cached_tokens),
        prompt_token_ids=prompt_ids if return_token_ids else None,
        agent_hint_result=await after(),
        hintkv_metrics=HintkvMetrics.of(fin.metrics, fin.times),
    )
    return json_response(resp)


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise `ClientDisconnected`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()
