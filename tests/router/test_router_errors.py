"""The router's own errors are the instance's: OpenAI's error shape, and a client gone mid-body is a 499.

Found probing a live router with the instance's hostile cases (hard29): every unknown path or wrong method was
Starlette's `{"detail": "Not Found"}` / `{"detail": "Method Not Allowed"}` (the instance answers in OpenAI's shape),
and a client that left while the router read its body raised ClientDisconnect out of the app: a 500 and an
"Exception in ASGI application" traceback logged for each. The router now installs the instance's handlers."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from hintkv.bench.fuzz_cases import answer_problem
from hintkv.router import build_router_app
from hintkv.server.background import BackgroundServer

DOWN = "http://127.0.0.1:9"  # nothing listens there: these answers never reach an instance


@pytest.fixture(scope="module")
def router():
    with BackgroundServer(build_router_app([DOWN])) as srv:
        yield srv


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1/nope", 404), ("GET", "/v1/models/x", 404), ("GET", "/v1//chat/completions", 404),
    ("PUT", "/v1/chat/completions", 405), ("GET", "/v1/completions", 405), ("POST", "/v1/models", 405),
    ("DELETE", "/v1/sessions/s1", 405), ("POST", "/router/state", 405)])
def test_unknown_paths_and_methods_answer_in_openais_error_shape(router, method, path, status):
    r = httpx.request(method, router.base_url + path, timeout=30)
    assert r.status_code == status
    assert answer_problem(r.status_code, r.headers.get("content-type", ""), r.content) is None, r.text


def test_a_client_gone_while_its_body_is_read_is_a_499_not_an_error():
    app = build_router_app([DOWN])
    sent: list[dict] = []
    messages = iter([{"type": "http.request", "body": b'{"prompt"', "more_body": True}, {"type": "http.disconnect"}])

    async def receive() -> dict:
        return next(messages)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    asyncio.run(app(scope, receive, send))  # raised ClientDisconnect (after sending a 500)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    asyncio.run(app.state.router.close())
