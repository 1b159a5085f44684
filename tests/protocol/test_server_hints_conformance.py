"""Protocol conformance, for real: every example body of the Agent Hint protocol sent to a live
server (dummy:tiny weights, the real SmolLM2 tokenizer) the way the `openai` SDK sends it.

The bodies are those of test_agent_hint.EXAMPLES (the requests openJiuwen agent-core builds;
see /work/shared/protocol/agent-hint.md). Each is split as an agent framework does: standard
fields as SDK arguments, everything else (agent_hint, cache_salt, ...) in `extra_body`; only
`max_tokens` is added where an inference example leaves it out, to keep the test fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from test_agent_hint import EXAMPLES, _example_body

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.protocol import is_management_request, parse_agent_hint, resolved_edits
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer

SDK_FIELDS = ("messages", "tools", "tool_choice", "stream", "max_tokens", "temperature")


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[openai.OpenAI, str]]:
    engine = AsyncLLM.from_config(EngineConfig(
        model="dummy:tiny", dtype="float32", device="cpu", block_size=16,
        kv_cache_tokens=2048, max_model_len=512, max_num_seqs=4))
    try:
        with BackgroundServer(build_app(engine)) as srv:
            yield openai.OpenAI(base_url=srv.v1, api_key="none", max_retries=0, timeout=60), \
                engine.model_name
    finally:
        asyncio.run(engine.shutdown())


def _send(client: openai.OpenAI, model: str, body: dict):
    kwargs = {k: body[k] for k in SDK_FIELDS if k in body}
    if body["messages"]:
        kwargs.setdefault("max_tokens", 4)  # keep the test fast; the hint is sent as written
    extra = {k: v for k, v in body.items() if k not in SDK_FIELDS and k != "model"}
    return client.chat.completions.create(model=model, extra_body=extra, **kwargs)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_is_served(client, name):
    sdk, model = client
    body = _example_body(name)
    hint = parse_agent_hint(body, {}, len(body["messages"]), len(body.get("tools") or []))
    expected = [(e.type, e.target, e.start, e.end) for e in resolved_edits(hint)]
    reply = _send(sdk, model, body)
    if body.get("stream") and not is_management_request(hint, len(body["messages"])):
        chunks = list(reply)
        assert chunks[0].object == "chat.completion.chunk"
        finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(finals) == 1
        result = finals[0].model_extra.get("agent_hint_result")
    else:
        assert reply.object == "chat.completion" and len(reply.choices) == 1
        assert reply.choices[0].message.role == "assistant"
        result = reply.model_extra.get("agent_hint_result")
        if is_management_request(hint, len(body["messages"])):
            assert reply.choices[0].message.content == ""
            assert reply.choices[0].finish_reason == "stop"
            assert reply.usage.total_tokens == 0
        else:
            assert reply.usage.completion_tokens >= 1
    if not expected:
        assert result is None
        return
    assert result["session_id"] == hint.session_id
    assert result["parent_session_id"] == hint.parent_session_id
    assert [(e["type"], e["target"], e["start"], e["end"]) for e in result["edits"]] == expected
    assert all(e["action"] in ("evicted", "offloaded", "prefetched", "none") for e in result["edits"])
