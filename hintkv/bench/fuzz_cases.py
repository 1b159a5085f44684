"""Hypothesis strategies for whole HTTP requests to hintkv, and the check every answer must pass.

One case is (method, path, headers, body bytes). Bodies are built from a valid chat or
completion request with fields replaced by hostile values (wrong types, huge or non-finite
numbers, lone surrogates, deep nesting, long lists), a random `agent_hint` (every field, valid
or not), random headers (`x-session-id`, `authorization`: any latin-1 bytes; content type), or raw bytes that are
not JSON at all. Generation is kept cheap (max_tokens <= 2, short prompts) so that tens of
thousands of cases run in minutes; the server must answer every one with a 2xx or a 4xx in
OpenAI's error shape — a 5xx or no answer is a failure.

Used by `tests/fuzz/` (CI: 600 cases from a fixed seed) and `hintkv bench fuzz` (100,000 cases, a seed
of its own each run, printed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

LONE_SURROGATES = ("\\ud800", "\\udfff", "\\ud83d")  # JSON escapes of unpaired surrogates


@dataclass(frozen=True, slots=True)
class Case:
    method: str
    path: str
    headers: dict[str, str | bytes]  # bytes: sent as they are (latin-1, not only ASCII)
    body: bytes


# ---- values --------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
_json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
_ids = st.one_of(
    st.sampled_from(["s0", "s1", "s2", "main", "sub-1", ""]),
    st.text(max_size=20),
    st.text(min_size=250, max_size=300),
)
_edit = st.fixed_dictionaries(
    {"type": st.sampled_from(["evict", "offload", "prefetch", "keep", 3])},
    optional={
        "target": st.sampled_from(["session", "messages", "tools", "tokens", "other"]),
        "start": st.one_of(st.integers(-3, 6), _json_values),
        "end": st.one_of(st.integers(-3, 8), _json_values),
    },
)
_agent_hint = st.one_of(
    _json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "session_id": st.one_of(_ids, _json_values),
            "parent_session_id": st.one_of(_ids, _json_values),
            "context_management": st.one_of(
                _json_values,
                st.fixed_dictionaries(
                    {"manage_request": st.one_of(st.booleans(), _json_values)},
                    optional={"edits": st.one_of(st.lists(_edit, max_size=5), _json_values)},
                ),
            ),
            "cache_control": st.one_of(
                _json_values,
                st.fixed_dictionaries({"type": st.just("ephemeral"),
                                       "ttl": st.one_of(st.floats(-10, 5000), _json_values)}),
            ),
            "session_control": st.one_of(
                _json_values,
                st.fixed_dictionaries({"type": st.sampled_from(
                    ["start", "pause", "resume", "stop", "compact", "boom"])}),
            ),
        },
    ),
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "wizard"])},
    optional={
        "content": st.one_of(st.text(max_size=40), _json_values),
        "tool_calls": _json_values,
        "tool_call_id": st.one_of(st.text(max_size=8), _json_values),
        "name": st.one_of(st.text(max_size=8), _json_values),
    },
)
_sampling_fields = {
    "model": st.one_of(st.just("dummy:tiny"), st.text(max_size=10), _json_values),
    "temperature": st.one_of(st.floats(-1, 3), st.sampled_from([0, 1e-40, 1e-6, 2]), _json_values),
    "top_p": st.one_of(st.floats(-1, 2), _json_values),
    "seed": st.one_of(st.integers(-(2**65), 2**65), _json_values),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3), _json_values),
    "stream": st.one_of(st.booleans(), _json_values),
    "n": st.one_of(st.integers(0, 3), _json_values),
    "cache_salt": st.one_of(st.text(max_size=8), _json_values),
    "ignore_eos": st.one_of(st.booleans(), _json_values),
    "return_token_ids": st.one_of(st.booleans(), _json_values),
    "stop_token_ids": st.one_of(st.lists(st.integers(-1, 60000), max_size=3), _json_values),
    "stream_options": _json_values,
    "logprobs": _json_values,
    "agent_hint": _agent_hint,
    # vLLM's sampling extensions and OpenAI's penalties / bias: each reaches the sampler when valid
    "presence_penalty": st.one_of(st.floats(-3, 3), _json_values),
    "frequency_penalty": st.one_of(st.floats(-3, 3), _json_values),
    "repetition_penalty": st.one_of(st.floats(-1, 1e308), _json_values),
    "logit_bias": st.one_of(st.dictionaries(st.one_of(st.integers(-1, 60000).map(str), st.text(max_size=4)),
                                            st.one_of(st.floats(-200, 200), _json_values), max_size=4), _json_values),
    "top_k": st.one_of(st.integers(-2, 2**63), _json_values),
    "min_p": st.one_of(st.floats(-1, 2), _json_values),
    "min_tokens": st.one_of(st.integers(-1, 3), _json_values),
    "response_format": st.one_of(st.sampled_from([{"type": "text"}, {"type": "json_object"}]), _json_values),
    "user": _json_values,
}
# Never absent or null (that would generate up to the whole context): cheap or invalid.
_max_tokens = st.one_of(st.sampled_from([1, 2]), st.integers(-2, 0), st.text(max_size=3),
                        st.floats(0, 2), st.lists(st.integers(), max_size=2))
_chat_body = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(_message, min_size=1, max_size=3), _json_values),
     "max_tokens": _max_tokens},
    optional={
        **_sampling_fields,
        "tools": st.one_of(_json_values, st.lists(st.fixed_dictionaries({
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": st.text(max_size=8)})}), max_size=2)),
        "tool_choice": _json_values,
        "max_completion_tokens": st.one_of(st.integers(-1, 2), _json_values),
        "chat_template_kwargs": _json_values,
        "parallel_tool_calls": st.one_of(st.booleans(), _json_values),
    },
)
_completion_body = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(-2, 60000), max_size=8),
                         _json_values),
     "max_tokens": _max_tokens},
    optional=_sampling_fields,
)


def _poison(text: str, data: st.DataObject) -> str:
    """Maybe put a lone surrogate escape into one JSON string of `text`."""
    quote = text.find('"', data.draw(st.integers(0, max(0, len(text) - 1))))
    if quote < 0:
        return text
    return text[:quote + 1] + data.draw(st.sampled_from(LONE_SURROGATES)) + text[quote + 1:]


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    kind = draw(st.sampled_from(["valid", "valid", "valid", "poison", "nest", "raw", "number"]))
    obj: Any = draw(_chat_body if path.endswith("chat/completions") else _completion_body)
    text = json.dumps(obj, allow_nan=False)
    if kind == "poison":
        text = _poison(text, draw(st.data()))
    elif kind == "nest":
        depth = draw(st.sampled_from([30, 40, 999, 1001, 5000]))
        text = text[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
    elif kind == "number":
        field = draw(st.sampled_from(["temperature", "top_p", "seed", "max_tokens"]))
        lit = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "1" + "0" * 5000]))
        text = text[:-1] + f', "{field}": {lit}' + "}"
    elif kind == "raw":
        return draw(st.one_of(st.binary(max_size=40), st.just(b""), st.just(b"[]"),
                              st.just(b'{"messages": ['), st.just(b"\xff\xfe\x00")))
    return text.encode("utf-8")


# Header values as the bytes on the wire: latin-1 (0x20-0xFF but DEL), since a server decodes a
# header's bytes >= 0x80 as latin-1 (Starlette): such a bearer token was a 500 on every keyed route
# (review rev26 A19) that printable ASCII alone could never draw. HTTP trims a value's spaces.
_header_value = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
                        max_size=30).map(lambda s: s.strip(" ").encode("latin-1") or b"x")


@st.composite
def cases(draw: st.DrawFn, api_key: str) -> Case:
    path = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/completions",
                                 "/v1/chat/completions", "/v1/sessions/s0", "/v1/models",
                                 "/metrics", "/health", "/v1/nope"]))
    headers: dict[str, str | bytes] = {"content-type": draw(st.sampled_from(["application/json", "text/plain"]))}
    auth = draw(st.sampled_from(["good", "good", "good", "good", "none", "bad", "bad-bearer"]))
    if auth == "good":
        headers["authorization"] = f"Bearer {api_key}"
    elif auth == "bad":
        headers["authorization"] = draw(_header_value)
    elif auth == "bad-bearer":
        headers["authorization"] = b"Bearer " + draw(_header_value)
    if draw(st.booleans()):
        headers["x-session-id"] = draw(_header_value)
    if draw(st.booleans()):
        headers["x-parent-session-id"] = draw(_header_value)
    if path.startswith("/v1/sessions/"):
        path += draw(st.sampled_from(["", "?cache_salt=a", "/../x", "%00", "%ED%A0%80"]))
        return Case("GET", path, headers, b"")
    if path in ("/v1/models", "/metrics", "/health", "/v1/nope"):
        return Case("GET", path, headers, b"")
    return Case("POST", path, headers, draw(bodies(path)))


def answer_problem(status: int, content_type: str, body: bytes) -> str | None:
    """Why an answer breaks the contract (None: it does not): no 5xx, 4xx in OpenAI's shape."""
    if status >= 500:
        return f"{status}: {body[:200]!r}"
    if 400 <= status < 500 and status != 499:
        try:
            err = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            return f"{status} without an OpenAI error object: {body[:200]!r}"
        if set(err) != {"message", "type", "param", "code"} or not err["message"]:
            return f"{status} with a malformed error object: {err}"
    return None
