"""Seeded synthetic text for workloads: words, paragraphs, tool schemas, tool calls.

Every piece is drawn from one fixed word list with a caller's `random.Random`, so a workload is a
pure function of its seed. The words are common English and code terms; with SmolLM2's
byte-level BPE tokenizer one word is about one token (measured: 1.02 tokens a word over 1,000
words), which is what lets a generator aim at token counts without a tokenizer at hand.
"""

from __future__ import annotations

import json
import random

_WORD_TEXT = """the a of to in and is for that with on this as be by from it at or an are not file line test
    value function class module error return config server cache request session agent token block
    model query result data list index path buffer memory thread worker queue batch prefix layer
    tensor shape device host disk offload prefetch evict policy score hint parse render template
    message tool call output input read write open close check update create delete find search
    replace import export build run install debug trace log warn info fix patch diff commit branch
    merge review report issue handler router client stream chunk budget limit timeout retry state
    flag option default param argument type schema field key map set dict array string integer
    float bool null none true false loop step iter count size length offset start end begin stop
    next prev first last new old main base core util helper common shared local global remote
    source target store load save sync async await lock wait signal event task job plan explore
    summary context window history round turn user system assistant"""
WORDS = tuple(_WORD_TEXT.split())
TOKENS_PER_WORD = 1.0  # SmolLM2 BPE over WORDS (see the module docstring)
_WORDS_PER_LINE = 14
_SCHEMA_TOKENS = 60  # measured: a one-parameter schema with 4-word descriptions


def words(rng: random.Random, num_tokens: int) -> str:
    """About `num_tokens` tokens of seeded text, broken into lines like tool output."""
    n = max(1, round(num_tokens / TOKENS_PER_WORD))
    picked = [rng.choice(WORDS) for _ in range(n)]
    lines = [" ".join(picked[i:i + _WORDS_PER_LINE]) for i in range(0, n, _WORDS_PER_LINE)]
    return "\n".join(lines)


def identifier(rng: random.Random, parts: int = 2) -> str:
    return "_".join(rng.choice(WORDS[20:]) for _ in range(parts))  # skip the short stop words


def tool_schema(rng: random.Random, name: str, num_tokens: int) -> dict:
    """An OpenAI function tool of one string parameter whose JSON is about `num_tokens` tokens."""
    param = identifier(rng, 1)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": words(rng, max(4, num_tokens - _SCHEMA_TOKENS)),
            "parameters": {"type": "object", "required": [param],
                           "properties": {param: {"type": "string", "description": words(rng, 4)}}},
        },
    }


def tool_call(rng: random.Random, call_id: str, tool: dict, num_tokens: int) -> dict:
    """One assistant `tool_calls` entry calling `tool` with about `num_tokens` tokens of arguments."""
    fn = tool["function"]
    param = fn["parameters"]["required"][0]
    args = {param: words(rng, max(2, num_tokens)).replace("\n", " ")}
    return {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": json.dumps(args)}}
