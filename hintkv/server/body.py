"""Reading a request body: JSON whatever the Content-Type says, then the pydantic model.

Handlers parse the body themselves rather than through FastAPI's injection so that (1) a
body sent without `Content-Type: application/json` (curl -d) is still read as JSON, and
(2) the raw dict stays available next to the model, for the protocol layer that validates
`agent_hint` with its own error paths.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from hintkv.server.errors import bad_request, validation_error

M = TypeVar("M", bound=BaseModel)


async def read_json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"Malformed JSON body: {exc}") from exc
    if not isinstance(obj, dict):
        raise bad_request("The request body must be a JSON object.")
    return obj


async def parse_body(request: Request, model: type[M]) -> tuple[M, dict[str, Any]]:
    """(validated request, raw JSON object) or a 400 naming the first bad field."""
    raw = await read_json_object(request)
    try:
        return model.model_validate(raw), raw
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from exc
