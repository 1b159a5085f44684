"""Reading a request body: capped in bytes, JSON whatever the Content-Type says, checked
against the request limits (`limits.py`), then the pydantic model.

Handlers parse the body themselves rather than through FastAPI's injection so that (1) a
body sent without `Content-Type: application/json` (curl -d) is still read as JSON, (2) the
size, depth, length and Unicode limits apply before anything else looks at it, and (3) the
raw dict stays available next to the model, for the protocol layer that validates
`agent_hint` with its own error paths.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from hintkv.server.errors import bad_request, validation_error
from hintkv.server.limits import RequestLimits, check_json, parse_json, too_large

M = TypeVar("M", bound=BaseModel)


async def read_limited(request: Request, max_bytes: int) -> bytes:
    """The whole body, or a 413 as soon as it (or its Content-Length) passes `max_bytes`.

    A client that leaves mid-upload raises starlette's `ClientDisconnect` (answered 499)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(request: Request, limits: RequestLimits) -> dict[str, Any]:
    obj = parse_json(await read_limited(request, limits.max_body_bytes), limits)
    if not isinstance(obj, dict):
        raise bad_request("The request body must be a JSON object.")
    check_json(obj, limits)
    return obj


async def parse_body(request: Request, model: type[M]) -> tuple[M, dict[str, Any]]:
    """(validated request, raw JSON object) or a 4xx naming the first bad field."""
    raw = await read_json_object(request, request.app.state.hintkv.limits)
    try:
        return model.model_validate(raw), raw
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from exc
