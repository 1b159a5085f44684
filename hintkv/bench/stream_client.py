"""The bench client: streamed OpenAI `/v1/completions` with token-id prompts, timed chunk by chunk.

    t = await stream_completion(base_url, model, prompt_ids, max_tokens=8)   # CompletionTiming
    t.ttft_s, t.decode_tok_per_s, t.server_metrics   # hintkv's `hintkv_metrics` of the last chunk, or None
    batch_decode_tok_per_s(await stream_batch(base_url, model, prompts, max_tokens=32))

Every benchmark that drives a server over HTTP (`bench engine`, `bench sessions`, ...) measures through these, so
hintkv and vLLM are timed by the same client. Re-exported by `hintkv.bench.common`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx


BUNCHED_GAP_S = 0.0002  # chunks closer than this came in one read: no engine steps that fast


@dataclass(slots=True)
class CompletionTiming:
    """When one streamed completion's pieces arrived, in seconds after the request was sent."""

    prompt_tokens: int
    sent_at: float  # time.perf_counter() when the request was sent
    chunk_times: list[float]  # arrival time of each chunk that carried output
    num_tokens: int  # generated tokens (usage.completion_tokens when reported, else chunks)
    total_s: float  # until the stream closed
    finish_reason: str | None = None
    server_metrics: dict[str, Any] | None = None  # hintkv's `hintkv_metrics` of the last chunk (None: another server)

    @property
    def ttft_s(self) -> float:
        return self.chunk_times[0] if self.chunk_times else self.total_s

    @property
    def inter_token_s(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def decode_tok_per_s(self) -> float | None:
        """Tokens after the first, over the time from the first chunk to the last; None for a stream
        whose chunks came bunched (most gaps under BUNCHED_GAP_S: a read that took several at once,
        the client held up while they queued), whose span says nothing of the decode (one such
        round read 293,261 tok/s against its neighbours' ~100)."""
        if len(self.chunk_times) < 2:
            return None
        gaps = self.inter_token_s
        if sum(g < BUNCHED_GAP_S for g in gaps) * 2 > len(gaps):
            return None
        span = self.chunk_times[-1] - self.chunk_times[0]
        return (self.num_tokens - 1) / span if span > 0 else None


def completion_body(
    model: str, prompt_token_ids: Sequence[int], max_tokens: int, *, ignore_eos: bool = True, **extra: Any
) -> dict[str, Any]:
    """An OpenAI `/v1/completions` streaming request with a token-id prompt, greedy."""
    return {
        "model": model,
        "prompt": list(prompt_token_ids),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,  # an extra field both hintkv and vLLM accept
        **extra,
    }


async def stream_completion(
    base_url: str,
    model: str,
    prompt_token_ids: Sequence[int],
    max_tokens: int,
    *,
    client: httpx.AsyncClient | None = None,
    ignore_eos: bool = True,
    timeout_s: float = 600.0,
    **extra: Any,
) -> CompletionTiming:
    """Send one streaming completion and time each chunk that carries a choice."""
    body = completion_body(model, prompt_token_ids, max_tokens, ignore_eos=ignore_eos, **extra)
    own = client is None
    client = client or httpx.AsyncClient(timeout=timeout_s)
    chunk_times: list[float] = []
    usage_tokens: int | None = None
    finish: str | None = None
    server_metrics: dict[str, Any] | None = None
    try:
        t0 = time.perf_counter()
        async with client.stream("POST", base_url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                raise RuntimeError(f"HTTP {resp.status_code} from {base_url}: {text[:500]}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter() - t0
                event = json.loads(data)
                if event.get("usage"):
                    usage_tokens = event["usage"].get("completion_tokens", usage_tokens)
                server_metrics = event.get("hintkv_metrics") or server_metrics
                for choice in event.get("choices") or ():
                    chunk_times.append(now)
                    finish = choice.get("finish_reason") or finish
                    break
        total = time.perf_counter() - t0
        if usage_tokens is not None and len(chunk_times) > usage_tokens:
            # a trailing chunk that only carries finish_reason (hintkv sends one) is not a token
            chunk_times = chunk_times[: max(usage_tokens, 1)]
    finally:
        if own:
            await client.aclose()
    return CompletionTiming(
        prompt_tokens=len(prompt_token_ids),
        sent_at=t0,
        chunk_times=chunk_times,
        num_tokens=usage_tokens if usage_tokens is not None else len(chunk_times),
        total_s=total,
        finish_reason=finish,
        server_metrics=server_metrics,
    )


async def stream_batch(
    base_url: str,
    model: str,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    timeout_s: float = 600.0,
) -> list[CompletionTiming]:
    """Send all prompts at once as concurrent streams (a batch of len(prompts))."""
    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=len(prompts) + 4)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        return list(
            await asyncio.gather(
                *(
                    stream_completion(base_url, model, p, max_tokens, client=client, ignore_eos=ignore_eos)
                    for p in prompts
                )
            )
        )


MIN_WINDOW_SHARE = 0.25  # of the whole decode span, for the all-streams window to count


def batch_decode_tok_per_s(timings: Sequence[CompletionTiming]) -> float | None:
    """Aggregate decode throughput of concurrent streams, over the window where all decode.

    Counts chunks that arrived after the last stream's first token and before the first stream
    ended; a server that ran the streams one after another has no such window (or one shorter than
    MIN_WINDOW_SHARE of the decode span) and gets the plain total (all tokens after each stream's
    first over the whole decode span) instead.
    """
    if not timings or any(len(t.chunk_times) < 2 for t in timings):
        return None
    base = min(t.sent_at for t in timings)
    abs_times = [[t.sent_at - base + c for c in t.chunk_times] for t in timings]
    start = max(ts[0] for ts in abs_times)
    end = min(ts[-1] for ts in abs_times)
    first = min(ts[0] for ts in abs_times)
    last = max(ts[-1] for ts in abs_times)
    tokens_per_chunk = [t.num_tokens / len(t.chunk_times) for t in timings]
    # a window of a sliver of the span (one stream ending just as the last starts) holds a step's bunched
    # chunks over microseconds: a rate of tens of thousands of tokens/s; it must span a quarter of the decode
    if end > start and end - start >= MIN_WINDOW_SHARE * (last - first):
        count = sum(k * sum(1 for c in ts if start < c <= end) for k, ts in zip(tokens_per_chunk, abs_times))
        if count >= 2 * len(timings):
            return count / (end - start)
    total = sum(t.num_tokens - 1 for t in timings)
    return total / (last - first) if last > first else None
