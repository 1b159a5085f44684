"""Limits on what one request body may hold, checked before any model or engine code sees it.

A body is read with a byte cap (413 past it, before it is all in memory), its nesting measured
on the raw text (brackets outside strings: a body too deep is refused before `json.loads`, so
the answer never depends on the process's recursion limit), parsed as JSON (NaN/Infinity
literals and numbers that overflow are refused), then walked once, iteratively, checking:

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
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import Any

from hintkv.server.errors import APIError, bad_request

_SURROGATE = re.compile("[\ud800-\udfff]")
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_CLOSER = {"[": "]", "{": "}"}


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


def parse_json(raw: bytes, limits: RequestLimits | None = None) -> Any:
    """JSON text -> Python value, or a 400 that says what is wrong (never another exception).
    With `limits`, a body nested deeper than `limits.max_depth` is refused before parsing."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"Malformed JSON body: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if limits is not None:
        _check_raw_depth(text, limits)
    return _loads(text)


def _loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise bad_request("Malformed JSON body: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, an int of over 4300 digits
        raise bad_request(f"Malformed JSON body: {str(exc)[:200]}") from None


def _check_raw_depth(text: str, limits: RequestLimits) -> None:
    """A 400 naming the field where `text` nests deeper than `limits.max_depth`, decided without
    parsing it whole. Escapes blanked (same length), the text split at quotes: its even parts are
    outside strings, and their brackets give the depth, in C-speed passes."""
    if text.count("[") + text.count("{") <= limits.max_depth:
        return
    parts = text.replace("\\\\", "__").replace('\\"', "__").split('"')
    brackets = _NOT_BRACKET.sub("", "".join(parts[0::2]))
    if len(brackets) <= 2 * limits.max_depth \
            or max(accumulate(map(_STEP.__getitem__, brackets))) <= limits.max_depth:
        return
    _refuse_too_deep(text, parts, brackets, limits)


def _refuse_too_deep(text: str, parts: list[str], brackets: str, limits: RequestLimits) -> None:
    """Raise the 400 for a body too deep: the text up to its first container too deep, that
    container emptied and the open ones closed, is parsed and walked, so the error names the
    same path `check_json` gives (or an earlier broken limit, or the JSON error before it).
    Every pass is C-speed (list/bytes searches, a counted regex), however wide the body."""
    depths = list(accumulate(map(_STEP.__getitem__, brackets)))
    k = depths.index(limits.max_depth + 1)  # the bracket opening the first container too deep
    if min(depths[:k], default=0) < 0:  # a stray closer: json stops there, before any depth
        _loads(text)
        raise bad_request("Malformed JSON body")
    levels = bytes(depths[:k])
    closers, end = [], k
    for d in range(limits.max_depth, 0, -1):  # the open container of each level, innermost first
        end = levels.rfind(d - 1, 0, end) + 1
        closers.append(_CLOSER[brackets[end]])
    outside = "".join(parts[0::2])
    q = re.match(r"(?:[^\[\]{}]*[\[\]{}]){" + str(k) + r"}[^\[\]{}]*", outside).end()  # its place
    ends = list(accumulate(map(len, parts[0::2])))
    e = bisect_right(ends, q)  # the even part (outside strings) holding it
    offset = sum(map(len, parts[:2 * e])) + 2 * e + q - (ends[e - 1] if e else 0)
    check_json(_loads(text[:offset] + "[]" + "".join(closers)), limits)
    raise bad_request(f"body: nested more than {limits.max_depth} levels deep")


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
            if any(map(isinstance, value, repeat((str, dict, list)))):  # a token-id list has none: one C pass
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
