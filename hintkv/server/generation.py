"""One request through the engine, as text: detokenize, cut at stop strings, count, abort.

Both endpoints (chat and completions) consume `generate_text`, which turns the engine's
token increments into `TextDelta`s and ends with one `Finished`. Whatever way the consumer
stops early (a stop string, a client that disconnected and cancelled the task, an error),
the engine's stream is closed inside a shielded scope (closing it aborts the request), so
its KV is freed even while the surrounding task is being cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass

import anyio

from hintkv.engine.client import EngineClient
from hintkv.engine.types import GenerateRequest, RequestMetrics
from hintkv.models.tokenizer import IncrementalDetokenizer
from hintkv.server.errors import APIError, bad_request
from hintkv.server.metrics import ServerMetrics
from hintkv.server.serve_times import ServeTimes
from hintkv.server.stop_strings import StopStringMatcher


@dataclass(slots=True)
class TextDelta:
    text: str
    token_ids: list[int]
    times: ServeTimes | None = None  # the request's marks: `sending` stamps the first chunk handed out

    def sending(self) -> None:
        """The consumer is about to send this delta's chunk (or, whole, collected it):
        `ServeTimes.sending`. A consumer that holds a delta back (empty text, a buffered tool call)
        does not call it."""
        if self.times is not None:
            self.times.sending()


@dataclass(slots=True)
class Finished:
    finish_reason: str  # "stop" (EOS, stop token or stop string), "length", or the engine's "abort"
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    metrics: RequestMetrics | None = None  # the engine's figures (None: a stop string ended it first)
    times: ServeTimes | None = None  # the server's marks around the engine (`serve_times.py`)


async def generate_text(
    engine: EngineClient,
    req: GenerateRequest,
    stops: list[str],
    metrics: ServerMetrics,
    times: ServeTimes,
) -> AsyncIterator[TextDelta | Finished]:
    """Yield text increments of `req`, then one `Finished`. Consume it inside `aclosing`.
    Marks `times`: handed to the engine and its first token on the loop; the consumer marks the
    first chunk handed out (`TextDelta.sending`, or `ServeTimes.sending` at `Finished`)."""
    arrival = times.arrival
    detok = IncrementalDetokenizer(engine.tokenizer)
    matcher = StopStringMatcher(stops)
    min_tokens = req.sampling.min_tokens
    stream = engine.generate(req)
    num_output = 0
    done = False
    times.handed = ServeTimes.now()
    try:
        async for out in stream:
            if out.error is not None:
                raise APIError(500, f"engine error: {out.error}", type="server_error")
            if out.new_token_ids and num_output == 0:
                times.first_out = ServeTimes.now()
                metrics.ttft.observe(times.first_out - arrival)
            # the outputs up to min_tokens are free of stop strings (vLLM's rule: `StopStringMatcher`)
            num_free = max(0, min(len(out.new_token_ids), min_tokens - num_output))
            free = detok.step(out.new_token_ids[:num_free]) if num_free else ""
            num_output += len(out.new_token_ids)
            metrics.generation_tokens.inc(len(out.new_token_ids))
            text = detok.step(out.new_token_ids[num_free:]) + (detok.flush() if out.finished else "")
            text = matcher.feed(text, free)
            if matcher.stopped and not out.finished:  # queued before the close below aborts it too
                _observe_when_aborted(engine.abort(req.request_id), metrics)
            if out.finished or matcher.stopped:
                text += matcher.flush()
                if text or out.new_token_ids:
                    yield TextDelta(text, list(out.new_token_ids), times)
                done = out.finished
                metrics.e2e_latency.observe(ServeTimes.now() - arrival)
                reason = "stop" if matcher.stopped else out.finish_reason or "stop"
                if out.metrics is not None:
                    metrics.request.observe(out.metrics)
                yield Finished(reason, out.num_prompt_tokens, out.num_cached_tokens, num_output,
                               out.metrics, times)
                return
            if text or out.new_token_ids:
                yield TextDelta(text, list(out.new_token_ids), times)
        raise APIError(500, "engine stream ended without finishing", type="server_error")
    except ValueError as exc:  # the engine refused the request when it was added
        raise bad_request(str(exc)) from exc
    finally:
        if not done:  # closing the engine's stream aborts the request and frees its KV
            with anyio.CancelScope(shield=True):
                await stream.aclose()


def _observe_when_aborted(figures: Awaitable[RequestMetrics | None], metrics: ServerMetrics) -> None:
    """A stop string's request is aborted in the engine: its figures reach the histograms once the abort
    is done, off the reply's path (its `hintkv_metrics` stays absent: waiting would hold the reply up to a
    step). Without this the histograms left out every request a stop string ended (review rev26 A8)."""

    def observe(done: asyncio.Future) -> None:
        if not done.cancelled() and done.exception() is None and done.result() is not None:
            metrics.request.observe(done.result())

    asyncio.ensure_future(figures).add_done_callback(observe)


async def collect_text(
    events: AsyncIterator[TextDelta | Finished],
) -> tuple[str, list[int], Finished]:
    """Drain `generate_text` into (whole text, all output token ids, how it finished)."""
    pieces: list[str] = []
    token_ids: list[int] = []
    async with aclosing(events) as stream:
        async for ev in stream:
            if isinstance(ev, Finished):
                if ev.times is not None:
                    ev.times.sending()  # no delta came (a stop string ended it first)
                return "".join(pieces), token_ids, ev
            ev.sending()  # a whole response: its first token collected
            pieces.append(ev.text)
            token_ids.extend(ev.token_ids)
    raise APIError(500, "generation ended without finishing", type="server_error")
