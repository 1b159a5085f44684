"""The router's HTTP front: OpenAI-compatible, forwarding each request to one hintkv instance.

    POST /v1/chat/completions, /v1/completions   placed by session (see `affinity.Placement`),
                                                 streamed through as the instance sends it
    GET  /v1/sessions/{id}                       the instance that holds the session
    GET  /v1/models                              any healthy instance
    GET  /health, /metrics, /router/state        the router's own view

A request whose instance cannot be reached (refused, reset, or no reply within the connect
timeout) is marked down and retried on the next instance the placement picks, before anything
was sent to the client: the session moves, and the new instance loads its prefix from the shared
pool. A request of no session that an instance refuses at capacity (503) goes to the next one too;
a session's stays (its KV is there), with the instance's Retry-After. A request that carries an
evict (an `evict` edit or `session_control` stop/compact) goes to the session's instance, and the
same evict, as a management request, to every other healthy instance the session or one of its
sub-agents was ever placed on (`Placement.fanout_targets`; elsewhere it is unknown), so no instance
keeps KV of an ended session. A client that leaves before its reply (streamed or not) closes the
router's connection to the instance, which aborts the generation; its evicts still reach every
instance (the instance applies them for a departed client too). Bad bodies are 400s in the OpenAI
error shape; no instance up is a 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)

from hintkv.protocol.agent_hint import PARENT_SESSION_HEADER, SESSION_HEADER, hint_identity
from hintkv.router.affinity import Placement
from hintkv.router.backends import Backend, Backends
from hintkv.server.body import read_limited
from hintkv.server.auth import authenticate
from hintkv.server.errors import APIError, install_error_handlers
from hintkv.server.limits import MAX_BODY_BYTES
from hintkv.server.streaming import ClientDisconnected, cancel_on_disconnect

log = logging.getLogger(__name__)

EVICT_TIMEOUT_S = 3.0  # an evict's budget (agent-hint.md: 3.0 s for a session evict)
_FORWARD_HEADERS = ("authorization", SESSION_HEADER, PARENT_SESSION_HEADER, "content-type")
_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError,
              httpx.ReadError, httpx.WriteError, httpx.PoolTimeout)


def _error(status: int, message: str, param: str | None = None, type_: str =
           "invalid_request_error", headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": None}}, status_code=status, headers=headers)


def _sse_error(message: str) -> bytes:
    """An OpenAI-shaped error event and the stream's end, for a stream the router must cut short."""
    err = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()


class Identity:
    """Who a request belongs to, as far as placement goes."""

    def __init__(self, body: dict, headers) -> None:
        hint = body.get("agent_hint") if isinstance(body.get("agent_hint"), dict) else {}
        sid, parent = hint_identity(hint, headers)  # as the instance reads it
        auth = hashlib.blake2b(headers.get("authorization", "").encode(), digest_size=8).hexdigest()
        salt = body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else ""
        self.key = json.dumps([auth, salt, sid]) if isinstance(sid, str) else None
        self.parent_key = json.dumps([auth, salt, parent]) if isinstance(parent, str) else None
        self.is_root = self.key is not None and (parent is None or parent == sid)
        cm = hint.get("context_management") if isinstance(hint.get("context_management"),
                                                          dict) else None
        sc = hint.get("session_control") if isinstance(hint.get("session_control"), dict) else None
        edits = cm.get("edits") if cm is not None and isinstance(cm.get("edits"), list) else []
        self.evicts = any(isinstance(e, dict) and e.get("type") == "evict" for e in edits) or (
            sc is not None and sc.get("type") in ("stop", "compact"))
        self.ends_session = self.evicts and (
            any(isinstance(e, dict) and e.get("type") == "evict" and e.get("target") == "session"
                for e in edits) or (sc is not None and sc.get("type") == "stop"))
        self.has_cm = cm is not None


def management_copy(body: dict, path: str) -> dict:
    """The same edits as a management request (nothing generated), for the other instances."""
    out = copy.deepcopy(body)
    out["stream"] = False
    hint = out["agent_hint"]
    if isinstance(hint.get("context_management"), dict):
        hint["context_management"]["manage_request"] = True
    elif path.endswith("chat/completions"):
        out["messages"] = []  # a session_control alias alone, no messages: a management request
    else:
        out.pop("prompt", None)
    return out


class Router:
    def __init__(self, urls: list[str], max_inflight: int = 8, health_interval_s: float = 1.0,
                 connect_timeout_s: float = 2.0, request_timeout_s: float = 600.0,
                 api_keys: tuple[str, ...] = (), public_metrics: bool = False) -> None:
        self.api_keys = tuple(api_keys)  # the instances' rule (`server.auth`): none, no authentication
        self.public_metrics = public_metrics  # /metrics and /router/state without a key
        self.backends = Backends(urls, interval_s=health_interval_s)
        self.backends.on_up = self._pay_owed
        self._paying: dict[str, asyncio.Task] = {}  # backends being sent their owed evicts
        self.placement = Placement(self.backends, max_inflight)
        self.timeout = httpx.Timeout(request_timeout_s, connect=connect_timeout_s)
        self._client: httpx.AsyncClient | None = None
        self._checks: asyncio.Task | None = None
        self.num_requests = 0
        self.num_fanout = 0  # evicts sent to other instances
        self.num_owed_dropped = 0  # owed evicts an instance could not take before the session's next request

    def client(self) -> httpx.AsyncClient:
        """Made on first use, inside the serving loop (also starts the health checks)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout,
                                             limits=httpx.Limits(max_connections=512))
            self._checks = asyncio.get_running_loop().create_task(
                self.backends.run_checks(self._client))
        return self._client

    async def close(self) -> None:
        if self._checks is not None:
            self._checks.cancel()
        if self._client is not None:
            await self._client.aclose()

    async def forward(self, request: Request, path: str) -> Response:
        try:  # the instances' own cap, read before the whole body is in memory (review rev26 A13)
            raw = await read_limited(request, MAX_BODY_BYTES)
        except APIError as e:
            return _error(e.status_code, e.message)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return _error(400, "the request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        who = Identity(body, request.headers)
        # the raw bytes: a value with a byte >= 0x80 (read as latin-1) goes on as sent; httpx would refuse its str
        headers = [(k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() in _FORWARD_HEADERS]
        self.num_requests += 1
        stream = body.get("stream") is True
        tried: set[str] = set()
        # read before `choose`: for a session the table does not know (a restarted router, one that
        # fell out of the table) `choose` places it, and its trail would name that one instance
        targets = self.placement.fanout_targets(who.key) if who.evicts else None
        while True:
            b = self.placement.choose(who.key, who.parent_key, tried)
            if b is None:
                return _error(503, "no backend instance is up", type_="server_error",
                              headers={"Retry-After": "1"})
            tried.add(b.url)
            if b.owed and who.key is not None:
                await self._pay_before(b, who.key)
            b.inflight += 1
            b.num_requests += 1
            try:
                req = self.client().build_request("POST", f"{b.url}{path}", content=raw,
                                                  headers=headers)
                # a client that leaves meanwhile: the send is cancelled, httpx closes the connection,
                # and the instance sees its client gone and aborts (review rev26 A1)
                resp = await cancel_on_disconnect(request, self.client().send(req, stream=True))
            except ClientDisconnected:
                b.inflight -= 1
                # the request may not have reached `b` (cancelled waiting for a connection): its evicts go
                # there too (an evict it did apply is a no-op the second time) (review rev27 B4)
                return await self._client_gone(who, body, path, headers, None, targets)
            except _RETRYABLE as e:
                b.inflight -= 1
                self.backends.mark_down(b, type(e).__name__)
                b.num_failovers += 1
                continue
            except httpx.TimeoutException:
                b.inflight -= 1
                b.num_errors += 1
                return _error(504, f"backend {b.url} timed out", type_="server_error")
            except httpx.HTTPError as e:  # anything else httpx raises: the backend's fault, not ours
                b.inflight -= 1
                b.num_errors += 1
                return _error(502, f"backend {b.url} failed: {type(e).__name__}", type_="server_error")
            b.status_counts[resp.status_code] = b.status_counts.get(resp.status_code, 0) + 1
            if resp.status_code == 503 and who.key is None and self.placement.least_loaded(tried) is not None:
                # an instance at capacity (its load gate's 503): a request of no session holds no KV anywhere,
                # so another instance serves it as well; a session's stays, with Retry-After (review rev26 A16)
                await resp.aclose()
                b.inflight -= 1
                continue
            break
        if who.evicts and resp.status_code == 200:
            await self._evict_elsewhere(who, body, path, headers, b, targets)
        out_headers = {"x-hintkv-backend": b.url}
        if (retry_after := resp.headers.get("retry-after")) is not None:  # an overloaded instance's 429 / 503
            out_headers["Retry-After"] = retry_after  # (review rev26 A16)
        if stream and resp.headers.get("content-type", "").startswith("text/event-stream"):
            async def relay():
                torn = b""  # bytes after the last whole event: sent once their event is whole
                try:
                    async for chunk in resp.aiter_raw():
                        torn += chunk
                        # an event ends at a blank line: "\n\n" (hintkv, vLLM) or "\r\n\r\n"
                        lf, crlf = torn.rfind(b"\n\n"), torn.rfind(b"\r\n\r\n")
                        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
                        if end:
                            yield torn[:end]
                            torn = torn[end:]
                    if torn:
                        yield torn
                except httpx.HTTPError as e:  # the backend died mid-stream: say so, in the stream
                    self.backends.mark_down(b, type(e).__name__)  # (a torn last event is dropped)
                    yield _sse_error(f"backend {b.url} failed mid-stream: {type(e).__name__}")
                finally:
                    await resp.aclose()
                    b.inflight -= 1
            return StreamingResponse(relay(), status_code=resp.status_code,
                                     media_type="text/event-stream", headers=out_headers)
        try:  # a non-streamed reply comes whole at the generation's end: the client may leave first
            content = await cancel_on_disconnect(request, resp.aread())
        except ClientDisconnected:
            content = None
        except httpx.HTTPError as e:
            self.backends.mark_down(b, type(e).__name__)
            return _error(502, f"backend {b.url} failed mid-reply", type_="server_error")
        finally:
            await resp.aclose()  # closes the connection of an unread reply: the instance aborts
            b.inflight -= 1
        if content is None:
            return await self._client_gone(who, body, path, headers, b, targets)
        return Response(content, status_code=resp.status_code, headers=out_headers,
                        media_type=resp.headers.get("content-type"))

    async def _evict_elsewhere(self, who: Identity, body: dict, path: str, headers: list[tuple[bytes, bytes]],
                               served: Backend | None, targets: set[str] | None) -> None:
        """A request's evict has reached `served` (None: maybe none): the same to the session's other instances."""
        await self._fan_out(body, path, headers, served, targets, who.key)
        if who.ends_session and who.is_root:
            self.placement.forget(who.key)

    async def _client_gone(self, who: Identity, body: dict, path: str, headers: list[tuple[bytes, bytes]],
                           served: Backend | None, targets: set[str] | None) -> Response:
        """The client left before its reply; the instance aborts the generation but still applies the
        request's evicts (a stop or evict turn ends the session either way): so do the others."""
        if who.evicts:
            await self._evict_elsewhere(who, body, path, headers, served, targets)
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    async def _fan_out(self, body: dict, path: str, headers: list[tuple[bytes, bytes]], served: Backend | None,
                       targets: set[str] | None, key: str | None) -> None:
        """The evict to the other instances in `targets` (None: all of them): now to those up, and
        owed to those down (a busy instance is marked down after slow health checks, not dead),
        sent when a health check finds them up again (`_pay_owed`)."""
        wanted = [o for o in self.backends.backends.values()
                  if o is not served and (targets is None or o.url in targets)]
        if not wanted:
            return
        payload = management_copy(body, path)
        owed = (key, path, payload, headers)
        for o in wanted:
            if not o.up:
                o.owed.append(owed)
        others = [o for o in wanted if o.up]
        self.num_fanout += len(others)
        sent = await asyncio.gather(*(self._send_evict(o, path, payload, headers) for o in others))
        for o, ok in zip(others, sent):
            if not ok:
                o.owed.append(owed)

    async def _send_evict(self, o: Backend, path: str, payload: dict,
                          headers: list[tuple[bytes, bytes]]) -> bool:
        try:
            r = await self.client().post(f"{o.url}{path}", json=payload, headers=headers,
                                         timeout=EVICT_TIMEOUT_S)
            o.status_counts[r.status_code] = o.status_counts.get(r.status_code, 0) + 1
            return True
        except (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout):
            # slow, not dead (an evict is idempotent: it is owed again); whether it is up is the
            # health checks' call, else its sessions would move away from their KV
            return False
        except httpx.HTTPError as e:
            self.backends.mark_down(o, type(e).__name__)
            return False

    def _pay_owed(self, b: Backend) -> None:
        """Start sending `b` the evicts it missed while down (one task per backend at a time)."""
        if b.url in self._paying:
            return
        task = asyncio.get_running_loop().create_task(self._pay(b))
        self._paying[b.url] = task
        task.add_done_callback(lambda _: self._paying.pop(b.url, None))

    async def _pay(self, b: Backend) -> None:
        """The owed evicts, in order; stops at the first that fails (the next check starts again)."""
        while b.owed and b.up:
            owed = b.owed.popleft()
            self.num_fanout += 1
            if not await self._send_evict(b, *owed[1:]):
                b.owed.appendleft(owed)
                break

    async def _pay_before(self, b: Backend, key: str) -> None:
        """A session's owed evicts reach `b` before its next request there, in order ("actions of one
        session are sent in order"); one that cannot be sent now is dropped, not kept: sent later,
        it would act on the state the new request builds (end a live session, cut its new context)."""
        mine = [o for o in b.owed if o[0] == key]
        for owed in mine:
            b.owed.remove(owed)
        for i, owed in enumerate(mine):
            self.num_fanout += 1
            if not await self._send_evict(b, *owed[1:]):
                log.warning("router: %d owed evicts of a session dropped: %s did not take them before "
                            "the session's next request", len(mine) - i, b.url)
                self.num_owed_dropped += len(mine) - i
                return

    async def get_from(self, b: Backend | None, path: str, request: Request) -> Response:
        if b is None:
            return _error(503, "no backend instance is up", type_="server_error",
                          headers={"Retry-After": "1"})
        # the raw bytes: a value with a byte >= 0x80 (read as latin-1) goes on as sent; httpx would refuse its str
        headers = [(k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() in _FORWARD_HEADERS]
        try:
            r = await self.client().get(f"{b.url}{path}", headers=headers,
                                        params=dict(request.query_params))
        except httpx.HTTPError as e:
            self.backends.mark_down(b, type(e).__name__)
            return _error(502, f"backend {b.url} cannot be reached", type_="server_error")
        return Response(r.content, status_code=r.status_code,
                        media_type=r.headers.get("content-type"),
                        headers={"x-hintkv-backend": b.url})

    def state(self) -> dict[str, Any]:
        p = self.placement
        return {"requests": self.num_requests, "fanout": self.num_fanout, "owed_dropped": self.num_owed_dropped,
                "placement": {"affinity": p.num_affinity, "parent": p.num_parent,
                              "least_loaded": p.num_least_loaded, "moved": p.num_moved},
                "backends": {b.url: {"up": b.up, "inflight": b.inflight,
                                     "sessions": b.num_sessions, "requests": b.num_requests,
                                     "errors": b.num_errors, "failovers": b.num_failovers,
                                     "owed_evicts": len(b.owed)}
                             for b in self.backends.backends.values()}}


def build_router_app(urls: list[str], **options) -> FastAPI:
    """The router app over `urls` (options: see `Router`). `app.state.router` is the Router.

    With `api_keys`, every route but /health needs one of them as a Bearer key (401 before the body is
    read), as an instance's do; /metrics and /router/state, which name the instances and their load,
    too unless `public_metrics` (review rev26 A17: they answered anyone)."""
    router = Router(urls, **options)

    async def require_key(request: Request) -> None:
        authenticate(request, router.api_keys)

    async def require_metrics_key(request: Request) -> None:
        if not router.public_metrics:
            authenticate(request, router.api_keys)

    app = FastAPI(title="hintkv router")
    app.state.router = router
    install_error_handlers(app)  # the instance's: a 404 / 405 in OpenAI's shape, a client gone mid-body a 499
    keyed, metrics_keyed = [Depends(require_key)], [Depends(require_metrics_key)]

    @app.post("/v1/chat/completions", dependencies=keyed)
    async def chat(request: Request) -> Response:
        return await router.forward(request, "/v1/chat/completions")

    @app.post("/v1/completions", dependencies=keyed)
    async def completions(request: Request) -> Response:
        return await router.forward(request, "/v1/completions")

    @app.get("/v1/models", dependencies=keyed)
    async def models(request: Request) -> Response:
        return await router.get_from(router.placement.least_loaded(), "/v1/models", request)

    @app.get("/v1/sessions/{session_id:path}", dependencies=keyed)  # as the instance's route: an id may hold a "/"
    async def session(session_id: str, request: Request) -> Response:
        # the instance takes the namespace as ?cache_salt=: the placement key needs it too
        who = Identity({"cache_salt": request.query_params.get("cache_salt")},
                       {**request.headers, SESSION_HEADER: session_id})
        b = router.placement.lookup(who.key) if who.key else None
        if b is None or not b.up:
            return _error(404, f"no instance holds session {session_id!r}", param="session_id")
        return await router.get_from(b, f"/v1/sessions/{quote(session_id, safe='/')}", request)

    @app.get("/health")
    async def health() -> Response:
        router.client()
        up = router.backends.healthy()
        return JSONResponse({"status": "ok" if up else "unavailable",
                             "backends": {b.url: b.up for b in router.backends.backends.values()}},
                            status_code=200 if up else 503)

    @app.get("/metrics", dependencies=metrics_keyed)
    async def metrics() -> Response:
        p = router.placement
        extra = (f"# TYPE hintkv_router_requests_total counter\n"
                 f"hintkv_router_requests_total {router.num_requests}\n"
                 f"# TYPE hintkv_router_placements_total counter\n" + "".join(
                     f'hintkv_router_placements_total{{how="{k}"}} {v}\n' for k, v in
                     (("affinity", p.num_affinity), ("parent", p.num_parent),
                      ("least_loaded", p.num_least_loaded), ("moved", p.num_moved))))
        return PlainTextResponse(router.backends.metrics_text() + extra)

    @app.get("/router/state", dependencies=metrics_keyed)
    async def state() -> Response:
        return JSONResponse(router.state())

    return app
