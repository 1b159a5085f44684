"""The one serving path of /v1/chat/completions and /v1/completions; each route supplies an
`Endpoint` (its body model and what differs: hint parsing, prompt, response shapes).

    body (limits, model) -> model name, unsupported fields -> tenant -> agent_hint (400 if bad)
      manage_request: apply the edits, reply (never queued behind inference)
      otherwise:      load gate (429/503 + Retry-After) -> tokenise in a worker thread (text)
                      -> GenerateRequest (4xx if it cannot be served) -> engine
                      -> stream, or collect (cancelled if the client leaves) -> response
                      -> edits applied after the generation, result on the final response
                         (a client gone first: its evicts alone, `AfterGeneration`)

Everything that can refuse a request does so before the engine is touched; the load ticket is
released however the response ends (finished, cancelled, client gone).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import replace
from typing import Any, Protocol

import anyio

from fastapi import Request, Response
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from hintkv.protocol import AgentHintResult
from hintkv.server.admission import check_model, check_supported, generate_request
from hintkv.server.api_requests import _SamplingRequest
from hintkv.server.auth import caller_of
from hintkv.server.body import parse_body
from hintkv.server.errors import APIError
from hintkv.server.generation import Finished, TextDelta, collect_text, generate_text
from hintkv.server.hint_edits import apply_hint
from hintkv.server.hints import RequestHint
from hintkv.server.load import Ticket
from hintkv.server.serve_times import ServeTimes
from hintkv.server.state import ServerState, request_tenant, server_state
from hintkv.server.streaming import (
    ClientDisconnected,
    cancel_on_disconnect,
    sse_response,
)

Events = AsyncIterator[TextDelta | Finished]
ApplyHint = Callable[[], Awaitable[AgentHintResult | None]]


class Call(Protocol):
    """One request as an endpoint sees it, after its body and hint were validated."""

    hinted: RequestHint | None
    tokenizes: bool  # its prompt goes through the tokenizer (else: token ids, only range-checked)

    def check_prompt(self) -> None:
        """Raise a 400 if a generating request has no prompt."""

    def prompt_ids(self, tokenizer: Any) -> list[int]:
        """Tokenise (runs in a worker thread: it may take long on a large prompt)."""

    def apply_args(self, tokenizer: Any) -> dict[str, Any]:
        """Keyword arguments of `apply_hint` (render, messages, tools) for this endpoint."""

    def management_response(self, request_id: str, model: str, result: AgentHintResult) -> Response:
        ...

    def stream(self, events: Events, request_id: str, model: str, prompt_ids: list[int],
               after: ApplyHint) -> AsyncIterator[str]:
        ...

    async def response(self, text: str, token_ids: list[int], fin: Finished, request_id: str,
                       model: str, prompt_ids: list[int], after: ApplyHint) -> Response:
        ...


class Endpoint(Protocol):
    request_model: type[_SamplingRequest]
    id_prefix: str
    prompt_param: str

    def call(self, body: Any, raw: dict[str, Any], headers: Mapping[str, str],
             tenant: str) -> Call:
        """Parse the hint (HintError: 400) and keep what the rest of the request needs."""


class AfterGeneration:
    """A generating request's edits, applied once its generation is over: with the final response
    (`after`), or, when the client left first (`client_gone`), its evicts alone: a stop or evict turn
    ends the session or its stale context whether or not anyone reads the reply, while an offload or a
    prefetch for a turn nobody reads is dropped (review rev26 A11: a departed stop turn left its
    session live, its KV held, until --session-idle-expiry)."""

    def __init__(self, hinted: RequestHint | None, apply: Callable[[RequestHint], Awaitable[AgentHintResult]]):
        self.hinted = hinted
        self.apply = apply
        self.done = False

    async def after(self) -> AgentHintResult | None:
        self.done = True
        if self.hinted is None or not (self.hinted.edits or self.hinted.hint.notes):
            return None
        with anyio.CancelScope(shield=True):  # a client leaving mid-render must not lose them (review rev27 B3)
            return await self.apply(self.hinted)

    async def client_gone(self) -> None:
        if self.done or self.hinted is None:
            return
        self.done = True
        evicts = [e for e in self.hinted.edits if e.type == "evict"]
        if evicts:
            with anyio.CancelScope(shield=True):  # the stream's task may be cancelled around us
                await self.apply(replace(self.hinted, edits=evicts))


class TicketedStream(StreamingResponse):
    """A stream that gives its load ticket back however it ends, even if it never started, and
    that hands its request's evicts to `edits.client_gone` when it did not run to its end."""

    def __init__(self, inner: StreamingResponse, ticket: Ticket, edits: AfterGeneration) -> None:
        super().__init__(self._noting_the_end(inner.body_iterator), status_code=inner.status_code,
                         media_type=inner.media_type)
        self.raw_headers = inner.raw_headers
        self.ticket = ticket
        self.edits = edits
        self.completed = False

    async def _noting_the_end(self, chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk
        self.completed = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ticket.release()
            if not self.completed:
                await self.edits.client_gone()


def _admit(state: ServerState, tenant: str, arrival: float) -> Ticket:
    try:
        return state.gate.admit(tenant)
    except APIError as err:
        state.metrics.refused.labels(status=str(err.status_code)).inc()
        state.metrics.refuse_latency.observe(time.perf_counter() - arrival)
        raise


async def serve(request: Request, endpoint: Endpoint) -> Response:
    times = ServeTimes(ServeTimes.now())
    arrival = times.arrival
    body, raw = await parse_body(request, endpoint.request_model)
    state = server_state(request)
    engine = state.engine
    check_model(body.model, engine.model_name)
    check_supported(body)
    tenant = request_tenant(request, body.cache_salt)
    call = endpoint.call(body, raw, request.headers, tenant)
    hinted = call.hinted
    request_id = f"{endpoint.id_prefix}-{uuid.uuid4().hex}"

    async def apply(rh: RequestHint) -> AgentHintResult:
        return await apply_hint(engine, rh, enabled=state.hints, metrics=state.metrics,
                                executor=state.manage_pool, **call.apply_args(engine.tokenizer))

    if hinted is not None and hinted.manage:
        result = await apply(hinted)
        state.metrics.manage_latency.observe(time.perf_counter() - arrival)
        return call.management_response(request_id, engine.model_name, result)
    call.check_prompt()
    ticket = _admit(state, caller_of(tenant), arrival)
    try:
        loop = asyncio.get_running_loop()
        if call.tokenizes:
            prompt_ids = await loop.run_in_executor(state.cpu_pool, call.prompt_ids, engine.tokenizer)
        else:  # token ids: one range check, which costs less than a worker thread's hop (GIL)
            prompt_ids = call.prompt_ids(engine.tokenizer)
        gen_req = generate_request(
            engine,
            request_id,
            prompt_ids,
            body,
            prompt_param=endpoint.prompt_param,
            output_limit=body.output_limit,
            output_param=body.output_param,
            session=hinted.ref if hinted is not None and state.hints else None,
            tenant=tenant,
        )
        state.metrics.prompt_tokens.inc(len(prompt_ids))
        events = generate_text(engine, gen_req, body.stop_strings, state.metrics, times)
        edits = AfterGeneration(hinted, apply)
        if body.stream:
            stream = call.stream(events, request_id, engine.model_name, prompt_ids, edits.after)
            streamed, ticket = TicketedStream(sse_response(stream), ticket, edits), None
            return streamed
        try:
            text, token_ids, fin = await cancel_on_disconnect(request, collect_text(events))
        except ClientDisconnected:
            await edits.client_gone()
            return Response(status_code=499)
        return await call.response(text, token_ids, fin, request_id, engine.model_name,
                                   prompt_ids, edits.after)
    finally:
        if ticket is not None:
            ticket.release()
