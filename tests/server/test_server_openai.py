"""The OpenAI API through the official `openai` SDK against a live server (dummy:tiny)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from server_testing import API_KEY, BLOCK_SIZE, LiveServer, wait_until


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.v1, api_key=API_KEY, max_retries=0, timeout=60)


def _model(live_server: LiveServer) -> str:
    return live_server.engine.model_name


def test_models_lists_the_served_model(client, live_server):
    models = client.models.list()
    assert [m.id for m in models.data] == [_model(live_server)]


def test_health_needs_no_key(live_server):
    assert httpx.get(live_server.base_url + "/health").status_code == 200


def test_chat_completion(client, live_server):
    resp = client.chat.completions.create(
        model=_model(live_server),
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4,
        temperature=0,
    )
    choice = resp.choices[0]
    assert resp.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= resp.usage.completion_tokens <= 4
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_with_tools_and_extension_fields(client, live_server):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    plain = client.chat.completions.create(
        model=_model(live_server),
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=2,
        temperature=0,
    )
    with_tools = client.chat.completions.create(
        model=_model(live_server),
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools,
        tool_choice="auto",
        max_completion_tokens=2,
        temperature=0,
        seed=1,
        extra_body={"cache_salt": "tenant-a", "return_token_ids": True, "cache_sharing": True},
    )
    # The tools are rendered into the prompt, so it is longer.
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens
    extra = with_tools.model_extra or {}
    assert len(extra["prompt_token_ids"]) == with_tools.usage.prompt_tokens
    assert len(with_tools.choices[0].model_extra["token_ids"]) == 2


def test_completion_text_and_token_ids(client, live_server):
    by_text = client.completions.create(
        model=_model(live_server), prompt="The sky is", max_tokens=3, temperature=0
    )
    assert by_text.object == "text_completion"
    assert by_text.usage.completion_tokens == 3
    ids = live_server.engine.tokenizer.encode("The sky is")
    by_ids = client.completions.create(
        model=_model(live_server), prompt=ids, max_tokens=3, temperature=0
    )
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == by_text.choices[0].text  # greedy: same prompt, same text


def test_chat_stream_with_usage(client, live_server):
    stream = client.chat.completions.create(
        model=_model(live_server),
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 5
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(
        model=_model(live_server),
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=5,
        temperature=0,
    )
    assert text == whole.choices[0].message.content


def test_completion_stream_without_usage(client, live_server):
    chunks = list(
        client.completions.create(
            model=_model(live_server), prompt="Once upon", max_tokens=4, temperature=0, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert sum(1 for c in chunks if c.choices[0].text) >= 1


def test_repeated_long_prefix_hits_the_cache(client, live_server):
    system = "You are a careful assistant. " * 12  # well over two KV blocks
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}]
    first = client.chat.completions.create(
        model=_model(live_server), messages=messages, max_tokens=1, temperature=0
    )
    assert first.usage.prompt_tokens > 2 * BLOCK_SIZE
    messages[1]["content"] = "Hello again."
    second = client.chat.completions.create(
        model=_model(live_server), messages=messages, max_tokens=1, temperature=0
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 2 * BLOCK_SIZE <= cached < second.usage.prompt_tokens
    # A different cache_salt never shares blocks.
    salted = client.chat.completions.create(
        model=_model(live_server),
        messages=messages,
        max_tokens=1,
        temperature=0,
        extra_body={"cache_salt": "someone-else"},
    )
    assert salted.usage.prompt_tokens_details.cached_tokens == 0


def _reference_text(client, live_server, n: int) -> str:
    return (
        client.completions.create(
            model=_model(live_server), prompt="Tell me a story:", max_tokens=n, temperature=0
        )
        .choices[0]
        .text
    )


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_text(client, live_server, stream):
    reference = _reference_text(client, live_server, 12)
    assert len(reference) >= 6, reference
    stop = reference[3:6]  # begins mid-text, maybe mid-token
    expected = reference[: reference.index(stop)]
    kwargs = dict(
        model=_model(live_server),
        prompt="Tell me a story:",
        max_tokens=12,
        temperature=0,
        stop=[stop, "\x00never"],
    )
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        resp = client.completions.create(**kwargs)
        text, finish = resp.choices[0].text, resp.choices[0].finish_reason
    assert text == expected
    assert finish == "stop"


def test_metrics_report_requests_tokens_and_cache(client, live_server):
    client.completions.create(model=_model(live_server), prompt="x y z", max_tokens=1)
    body = httpx.get(live_server.base_url + "/metrics", headers=live_server.headers).text
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['hintkv_http_requests_total{endpoint="/v1/completions",status="200"}'] >= 1
    assert samples["hintkv_prompt_tokens_total"] > 0
    assert samples["hintkv_generation_tokens_total"] > 0
    assert samples["hintkv_time_to_first_token_seconds_count"] >= 1
    assert samples["hintkv_e2e_request_latency_seconds_count"] >= 1
    assert samples["hintkv_kv_blocks_total"] == live_server.engine.stats().kv_blocks_total
    assert (
        samples["hintkv_prefix_cache_query_tokens_total"]
        >= samples["hintkv_prefix_cache_hit_tokens_total"]
    )
    tiers = live_server.engine.tier_stats()
    assert samples["hintkv_prompt_tokens_computed_total"] == tiers["prompt_tokens_computed"] > 0
    assert samples['hintkv_prefix_cache_hit_tokens_by_tier_total{tier="device"}'] == tiers["hit_tokens"]["device"]
    for name in (
        "hintkv_kv_blocks_in_use",
        "hintkv_kv_blocks_cached",
        "hintkv_num_requests_running",
        "hintkv_num_requests_waiting",
    ):
        assert name in samples


def test_concurrent_async_clients(live_server):
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, int]:
        if i % 2:
            stream = await client.completions.create(
                model=_model(live_server),
                prompt=f"Request number {i}:",
                max_tokens=6,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            chunks = [c async for c in stream]
            return i, chunks[-1].usage.completion_tokens
        resp = await client.chat.completions.create(
            model=_model(live_server),
            messages=[{"role": "user", "content": f"Request number {i}"}],
            max_tokens=6,
            temperature=0.8,
            seed=i,
            extra_body={"ignore_eos": True},
        )
        return i, resp.usage.completion_tokens

    async def main() -> list[tuple[int, int]]:
        client = openai.AsyncOpenAI(base_url=live_server.v1, api_key=API_KEY, max_retries=0)
        async with client:
            return await asyncio.gather(*(one(client, i) for i in range(6)))

    assert sorted(asyncio.run(main())) == [(i, 6) for i in range(6)]
    assert wait_until(lambda: live_server.engine.stats().kv_blocks_in_use == 0)
