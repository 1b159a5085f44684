"""Limits on what one request body may hold, checked before any model or engine code sees it.

A body is read with a byte cap (413 past it, before it is all in memory), parsed as JSON
(NaN/Infinity literals and numbers that overflow are refused; nesting past the parser's
recursion limit is a 400, not a RecursionError), then walked once, iteratively, checking:

    depth  <= max_depth            (objects and arrays inside each other)
    len(s) <= max_string_chars     (every string, keys included)
    len(l) <= max_list_items       (every array: messages, tools, edits, stop, token ids ...)
    no lone surrogate in any string (they cannot be encoded as UTF-8, so no reply could echo them)

Each violation is a 400 naming the field by its path (`messages[3].content`), so a client can
fix it. The walk is linear in the body and runs in C-backed calls per node; a body under the
byte cap walks in milliseconds.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from hintkv.server.errors import APIError, bad_request

_SURROGATE = re.compile("[\ud800-\udfff]")


MAX_BODY_BYTES = 8 * 2**20  # a 128k-token context is ~0.5 MB of text
MAX_DEPTH = 32
MAX_STRING_CHARS = 4 * 2**20
MAX_LIST_ITEMS = 65536  # token-id prompts are lists too


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_body_bytes: int = MAX_BODY_BYTES
    max_depth: int = MAX_DEPTH
    max_string_chars: int = MAX_STRING_CHARS
    max_list_items: int = MAX_LIST_ITEMS


class _Limit(Exception):
    """A limit broken at a path; turned into a 400 by `check_json`."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"The request body is larger than this server accepts ({limit} bytes).",
        code="request_too_large",
    )


def parse_json(raw: bytes) -> Any:
    """JSON text -> Python value, or a 400 that says what is wrong (never another exception)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"Malformed JSON body: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise bad_request("Malformed JSON body: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, an int of over 4300 digits
        raise bad_request(f"Malformed JSON body: {str(exc)[:200]}") from None


def _join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    part = safe_text(part, 80)
    return f"{path}.{part}" if path else part


def safe_text(s: str, max_chars: int = 200) -> str:
    """`s` cut to `max_chars`, with anything UTF-8 cannot hold escaped: safe in any reply."""
    s = s[:max_chars]
    return s.encode("utf-8", "backslashreplace").decode("utf-8") if _SURROGATE.search(s) else s


def _check_string(s: str, path: str, limits: RequestLimits) -> None:
    if len(s) > limits.max_string_chars:
        raise _Limit(path, f"a string of {len(s)} characters; at most {limits.max_string_chars}")
    if _SURROGATE.search(s):
        raise _Limit(path, "the string holds an unpaired UTF-16 surrogate (invalid Unicode)")


def check_json(value: Any, limits: RequestLimits) -> None:
    """Raise a 400 naming the first field of `value` that breaks `limits`."""
    try:
        _walk(value, limits)
    except _Limit as exc:
        where = exc.path or "body"
        raise bad_request(f"{where}: {exc}", param=exc.path or None) from None


def _walk(root: Any, limits: RequestLimits) -> None:
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            _check_string(value, path, limits)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth >= limits.max_depth:
            raise _Limit(path, f"nested more than {limits.max_depth} levels deep")
        if isinstance(value, dict):
            for key, item in value.items():
                sub = _join(path, key)
                _check_string(key, sub, limits)
                stack.append((item, sub, depth + 1))
        else:
            if len(value) > limits.max_list_items:
                raise _Limit(path, f"a list of {len(value)} items; at most {limits.max_list_items}")
            stack.extend(
                (item, _join(path, i), depth + 1)
                for i, item in enumerate(value)
                if isinstance(item, (str, dict, list))
            )


def check_text(value: str | None, param: str, limits: RequestLimits) -> None:
    """The same string checks for a value from outside the body (a header, a path, a query)."""
    if value is None:
        return
    try:
        _check_string(value, param, limits)
    except _Limit as exc:
        raise bad_request(f"{param}: {exc}", param=param) from None
