"""OpenAI-style error objects, and the handlers that turn every failure into one.

Every 4xx/5xx the server sends has the shape OpenAI clients expect:
`{"error": {"message": ..., "type": ..., "param": <field or null>, "code": <str or null>}}`.
FastAPI's own 422 validation shape is replaced by a 400 in this shape, so a client sees the
same error object whether the JSON was malformed, a field had the wrong type, or a value was
out of range. Error bodies are written with ASCII escapes, so no client string can make the
reply itself fail to encode.

`CatchAll` is the last resort: an exception no handler maps is a bug. It is logged with its
stack trace, counted in `hintkv_internal_errors_total` (the tests assert it stays at zero), and
answered with a 500 error object on a connection that stays usable. A client that left while
its body was being read gets a 499 (nobody reads it), never a 500.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hintkv.protocol import HintError

logger = logging.getLogger(__name__)


class APIError(Exception):
    """A failure to report to the client as an OpenAI error object."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds, sent as Retry-After (429 / 503)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.type = type


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class SafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate in a message cannot break the reply."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(err: APIError) -> JSONResponse:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return SafeJSONResponse(
        error_body(err.message, err.type, err.param, err.code),
        status_code=err.status_code,
        headers=headers,
    )


def overloaded(message: str, retry_after: int, status_code: int = 503) -> APIError:
    """A request refused for load (429: this tenant's limit, 503: the server's), to retry later."""
    kind = "rate_limit_error" if status_code == 429 else "server_overloaded"
    return APIError(status_code, message, type=kind, code=kind, retry_after=retry_after)


_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    """('body', 'messages', 0, 'role') -> 'messages[0].role'; the body itself -> None."""
    parts = [p for p in loc if p != "body"]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.isidentifier() or part in _TYPE_LABELS:
            continue  # pydantic's union-member labels ("str", "list[int]") name no field
        else:
            out += f".{part}" if out else part
    return out or None


def _validation_message(err: dict[str, Any], param: str | None) -> str:
    msg = str(err.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{param}: {msg}" if param else msg


async def _handle_api_error(_: Request, exc: APIError) -> JSONResponse:
    return error_response(exc)


def validation_error(errors: Sequence[Any]) -> APIError:
    """The 400 for pydantic/FastAPI validation errors: the first one, naming its field."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return bad_request(f"Malformed JSON body: {first.get('msg', '')}")
    param = _param_from_loc(tuple(first.get("loc", ())))
    return bad_request(_validation_message(first, param), param=param)


async def _handle_hint_error(_: Request, exc: HintError) -> JSONResponse:
    """A malformed agent_hint: 400 naming the field, raised before anything was changed."""
    body = exc.as_error_body()
    body["error"].setdefault("code", None)  # the same four keys as every other error
    return SafeJSONResponse(body, status_code=400)


async def _handle_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(validation_error(exc.errors()))


async def _handle_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return SafeJSONResponse(
        error_body(str(exc.detail), kind), status_code=exc.status_code, headers=exc.headers
    )


async def _handle_disconnect(_: Request, exc: ClientDisconnect) -> Response:
    return Response(status_code=499)  # nobody is left to read it


class CatchAll:
    """ASGI middleware: an unmapped exception becomes a counted, logged 500; never re-raised
    (Starlette's own last-resort handler re-raises, and the server then drops the connection)."""

    def __init__(self, app: ASGIApp, on_error: Callable[[], None]) -> None:
        self.app = app
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_and_note(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception:
            self.on_error()
            logger.exception("unhandled server error on %s %s", scope.get("method"), scope["path"])
            if started:  # a stream already under way: end it; the client sees a cut stream
                with contextlib.suppress(Exception):  # the client may be gone already
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            resp = SafeJSONResponse(error_body("Internal server error", "server_error"),
                                    status_code=500)
            await resp(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _handle_api_error)  # type: ignore[arg-type]
    app.add_exception_handler(HintError, _handle_hint_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _handle_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _handle_http)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnect, _handle_disconnect)  # type: ignore[arg-type]
