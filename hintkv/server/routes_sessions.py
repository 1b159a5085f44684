"""GET /v1/sessions/{session_id}: one agent session's cache state, for debugging and dashboards.

    curl -H "Authorization: Bearer $KEY" 'localhost:8000/v1/sessions/main-0?cache_salt=team-7'

`protect_left_s` / `protect_until` (Unix time, seconds): how long a `cache_control.ttl` keeps the session's KV
warm (null when nothing does).

Only the caller's own tenant is searched (its API key identity plus the optional `cache_salt`
query parameter, as in a request body), so another tenant's session is a 404 exactly like one
that never existed: nothing about it is revealed.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict

from fastapi import APIRouter, Depends, Request, Response

from hintkv.server.errors import APIError
from hintkv.server.state import request_tenant, require_api_key, server_state

router = APIRouter()


@router.get("/v1/sessions/{session_id:path}", dependencies=[Depends(require_api_key)])
async def get_session(request: Request, session_id: str, cache_salt: str | None = None) -> Response:
    engine = server_state(request).engine
    tenant = request_tenant(request, cache_salt)
    info = await engine.describe_session(tenant, session_id)
    if info is None:
        raise APIError(
            404,
            f"No session {session_id!r} in this tenant's namespace.",
            param="session_id",
            code="session_not_found",
            type="not_found_error",
        )
    body = asdict(info)
    # the engine counts on its own (monotonic) clock; a caller reads until when on the wall clock
    left = info.protect_left_s
    body["protect_until"] = None if left is None else round(time.time() + left, 3)
    return Response(json.dumps(body), media_type="application/json")
