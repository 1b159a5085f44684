"""OpenAI-style error objects, and the handlers that turn every failure into one.

Every 4xx/5xx the server sends has the shape OpenAI clients expect:
`{"error": {"message": ..., "type": ..., "param": <field or null>, "code": <str or null>}}`.
FastAPI's own 422 validation shape is replaced by a 400 in this shape, so a client sees the
same error object whether the JSON was malformed, a field had the wrong type, or a value was
out of range.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

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
    ) -> None:
        super().__init__(message)
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


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(err.message, err.type, err.param, err.code), status_code=err.status_code
    )


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
    return JSONResponse(body, status_code=400)


async def _handle_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(validation_error(exc.errors()))


async def _handle_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(
        error_body(str(exc.detail), kind), status_code=exc.status_code, headers=exc.headers
    )


async def _handle_unexpected(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled server error", exc_info=exc)
    return JSONResponse(error_body("Internal server error", "server_error"), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _handle_api_error)  # type: ignore[arg-type]
    app.add_exception_handler(HintError, _handle_hint_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _handle_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _handle_http)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _handle_unexpected)
