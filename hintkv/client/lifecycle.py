"""Session lifecycle over an `openai` client, sent the way openJiuwen agent-core's runtime sends it.

    sc = SessionClient(openai.OpenAI(base_url=..., api_key=...), model="m")
    worker = sub_agent("main-0", "t1")
    sc.chat(worker, messages)          # ordinary inference, carries the hint
    sc.suspend(worker)                 # offload: the worker waits for a teammate
    sc.chat(worker, more_messages)     # prefetches first, since this client offloaded it
    sc.context_changed(worker, old_messages, old_tools, first_changed_message=3)
    sc.release(worker)                 # evict: the worker is done
    sc.release_tree("main-0")          # at shutdown: evict the whole tree

Each lifecycle call is one management request (`manage_request: true`; `messages: []` and no
tools for a whole-session action) with a whole-action time budget and a single attempt. It never
raises: a failed or slow action must not make the agent fail, so it returns an `ActionResult`
with `ok`/`error` and logs a warning. `AsyncSessionClient` does the same over `openai.AsyncOpenAI`
and sends the actions of one session in order (an evict waits for the offload before it).

Budgets: the async client bounds the whole call with `asyncio.wait_for`; the sync client can only
hand the budget to httpx, which applies it to each phase (connect, write, read) of the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from hintkv.client.hints import hint, manage_hint, messages_edit, session_edit, tools_edit
from hintkv.client.identity import Session, as_session

logger = logging.getLogger(__name__)

RANGE_TIMEOUT_S = 1.5
SESSION_MOVE_TIMEOUT_S = 2.0  # offload, prefetch
SESSION_EVICT_TIMEOUT_S = 3.0
TERMINAL_CLEANUP_TIMEOUT_S = 5.0  # evicting a whole tree at shutdown


def action_timeout(action: str, target: str) -> float:
    """The whole-action budget of one management request."""
    if target != "session":
        return RANGE_TIMEOUT_S
    return SESSION_EVICT_TIMEOUT_S if action == "evict" else SESSION_MOVE_TIMEOUT_S


@dataclass(slots=True)
class ActionResult:
    """What one lifecycle action came to; never an exception."""

    ok: bool
    action: str  # evict | offload | prefetch
    target: str  # session | messages | tools | messages+tools
    session_id: str
    error: str | None = None
    sent: bool = True  # False: nothing was sent (nothing to do, or the call was malformed)
    elapsed_s: float = 0.0
    agent_hint_result: dict | None = None  # the server's report, when it sends one


@dataclass(slots=True)
class ManagementRequest:
    """One management request, ready to become `chat.completions.create` keyword arguments."""

    session: Session
    action: str
    target: str
    edits: list[dict]
    timeout_s: float
    messages: list[dict]
    tools: list[dict] | None = None

    def create_kwargs(self, model: str) -> dict:
        kwargs: dict = {"model": model, "messages": self.messages, "stream": False}
        if self.tools:
            kwargs["tools"] = self.tools
            kwargs["tool_choice"] = "auto"
        kwargs["extra_body"] = manage_hint(self.session.session_id, self.session.parent, self.edits)
        return kwargs


class _SessionClientBase:
    """Request building and bookkeeping shared by the sync and async clients."""

    def __init__(self, client, model: str) -> None:
        self.client = client
        self.model = model
        self._offloaded: set[str] = set()  # sessions this client offloaded and has not prefetched
        self._trees: dict[str, set[str]] = {}  # root id -> session ids seen under it

    def is_offloaded(self, session: Session | str) -> bool:
        return as_session(session).session_id in self._offloaded

    def _chat_kwargs(self, session: Session, messages: list[dict], tools: list[dict] | None, kw: dict) -> dict:
        self._remember(session)
        extra_body = {**(kw.pop("extra_body", None) or {}), **hint(session.session_id, session.parent)}
        kwargs = {"model": kw.pop("model", self.model), "messages": messages, **kw, "extra_body": extra_body}
        if tools:
            kwargs["tools"] = tools
        return kwargs

    def _session_request(self, session: Session, action: str, timeout_s: float | None = None) -> ManagementRequest:
        self._remember(session)
        return ManagementRequest(
            session=session,
            action=action,
            target="session",
            edits=[session_edit(action)],
            timeout_s=timeout_s if timeout_s is not None else action_timeout(action, "session"),
            messages=[],
        )

    def _context_request(
        self,
        session: Session,
        old_messages: list[dict],
        old_tools: list[dict] | None,
        first_changed_message: int | None,
        first_changed_tool: int | None,
    ) -> ManagementRequest | None:
        self._remember(session)
        edits = []
        if first_changed_message is not None:
            edits.append(messages_edit("evict", first_changed_message, len(old_messages)))
        if first_changed_tool is not None:
            edits.append(tools_edit("evict", first_changed_tool, len(old_tools or [])))
        if not edits:
            return None
        return ManagementRequest(
            session=session,
            action="evict",
            target="+".join(edit["target"] for edit in edits),
            edits=edits,
            timeout_s=RANGE_TIMEOUT_S,
            messages=list(old_messages),
            tools=list(old_tools) if old_tools else None,
        )

    def _context_plan(self, session: Session, old_messages: list[dict], old_tools: list[dict] | None,
                      first_changed_message: int | None,
                      first_changed_tool: int | None) -> ManagementRequest | ActionResult:
        """The request to send for a context change, or the result when there is nothing to send."""
        started = time.perf_counter()
        try:
            request = self._context_request(session, old_messages, old_tools, first_changed_message, first_changed_tool)
        except ValueError as exc:
            return _unsent(session, exc, started)
        if request is None:
            return ActionResult(ok=True, action="evict", target="", session_id=session.session_id, sent=False)
        return request

    def _remember(self, session: Session) -> None:
        self._trees.setdefault(session.parent, set()).add(session.session_id)

    def _tree_members(self, root: str) -> list[str]:
        return sorted(self._trees.get(root, set()) | {root})

    def _record(self, request: ManagementRequest, ok: bool) -> None:
        sid = request.session.session_id
        if request.action == "prefetch":
            self._offloaded.discard(sid)  # fail open: a failed prefetch does not hold inference
        elif request.action == "offload" and ok:
            self._offloaded.add(sid)
        elif request.action == "evict" and request.target == "session":
            self._forget(sid)

    def _forget(self, session_id: str) -> None:
        self._offloaded.discard(session_id)
        for members in self._trees.values():
            members.discard(session_id)
        for member in self._trees.pop(session_id, set()):
            self._offloaded.discard(member)

    def _succeeded(self, request: ManagementRequest, reply, started: float) -> ActionResult:
        self._record(request, True)
        extra = getattr(reply, "model_extra", None) or {}
        return ActionResult(
            ok=True,
            action=request.action,
            target=request.target,
            session_id=request.session.session_id,
            elapsed_s=time.perf_counter() - started,
            agent_hint_result=extra.get("agent_hint_result"),
        )

    def _failed(self, request: ManagementRequest, error: BaseException, started: float) -> ActionResult:
        self._record(request, False)
        message = _describe(error)
        logger.warning(
            "agent_hint %s %s failed for session %s (parent %s): %s",
            request.action, request.target, request.session.session_id, request.session.parent, message,
        )
        return ActionResult(
            ok=False,
            action=request.action,
            target=request.target,
            session_id=request.session.session_id,
            error=message,
            elapsed_s=time.perf_counter() - started,
        )


class SessionClient(_SessionClientBase):
    """Hints and lifecycle actions over a synchronous `openai.OpenAI` client."""

    def chat(self, session: Session | str, messages: list[dict], tools: list[dict] | None = None, **kw):
        """An ordinary chat completion carrying the session's hint; prefetches first if offloaded."""
        session = as_session(session)
        if session.session_id in self._offloaded:
            self.prepare(session)
        return self.client.chat.completions.create(**self._chat_kwargs(session, messages, tools, kw))

    def prepare(self, session: Session | str) -> ActionResult:
        """Prefetch the session's KV ahead of its next request."""
        return self._send(self._session_request(as_session(session), "prefetch"))

    def suspend(self, session: Session | str) -> ActionResult:
        """Offload the session's KV while it waits."""
        return self._send(self._session_request(as_session(session), "offload"))

    def release(self, session: Session | str) -> ActionResult:
        """Evict the session's claim on its KV: it has ended."""
        return self._send(self._session_request(as_session(session), "evict"))

    def release_tree(self, root: str) -> ActionResult:
        """Evict a whole tree: the root session sent as its own parent (shutdown clean-up)."""
        return self._send(self._session_request(Session(root), "evict", TERMINAL_CLEANUP_TIMEOUT_S))

    def context_changed(
        self,
        session: Session | str,
        old_messages: list[dict],
        old_tools: list[dict] | None,
        first_changed_message: int | None = None,
        first_changed_tool: int | None = None,
    ) -> ActionResult:
        """Evict the KV of the old window from the first changed message/tool to its end."""
        planned = self._context_plan(as_session(session), old_messages, old_tools,
                                     first_changed_message, first_changed_tool)
        return planned if isinstance(planned, ActionResult) else self._send(planned)

    def _send(self, request: ManagementRequest) -> ActionResult:
        started = time.perf_counter()
        try:
            client = self.client.with_options(timeout=request.timeout_s, max_retries=0)
            reply = client.chat.completions.create(**request.create_kwargs(self.model))
        except Exception as exc:  # any failure: a lifecycle action must never fail the agent
            return self._failed(request, exc, started)
        return self._succeeded(request, reply, started)


class AsyncSessionClient(_SessionClientBase):
    """Hints and lifecycle actions over an `openai.AsyncOpenAI` client; per-session actions in order."""

    def __init__(self, client, model: str) -> None:
        super().__init__(client, model)
        self._locks: dict[str, asyncio.Lock] = {}

    async def chat(self, session: Session | str, messages: list[dict], tools: list[dict] | None = None, **kw):
        session = as_session(session)
        if session.session_id in self._offloaded:
            await self.prepare(session)
        return await self.client.chat.completions.create(**self._chat_kwargs(session, messages, tools, kw))

    async def prepare(self, session: Session | str) -> ActionResult:
        return await self._send(self._session_request(as_session(session), "prefetch"))

    async def suspend(self, session: Session | str) -> ActionResult:
        return await self._send(self._session_request(as_session(session), "offload"))

    async def release(self, session: Session | str) -> ActionResult:
        return await self._send(self._session_request(as_session(session), "evict"))

    async def release_tree(self, root: str) -> ActionResult:
        """Evict a whole tree once the pending actions of every session known under it are sent."""
        request = self._session_request(Session(root), "evict", TERMINAL_CLEANUP_TIMEOUT_S)
        return await self._send(request, lock_ids=self._tree_members(root))

    async def context_changed(
        self,
        session: Session | str,
        old_messages: list[dict],
        old_tools: list[dict] | None,
        first_changed_message: int | None = None,
        first_changed_tool: int | None = None,
    ) -> ActionResult:
        planned = self._context_plan(as_session(session), old_messages, old_tools,
                                     first_changed_message, first_changed_tool)
        return planned if isinstance(planned, ActionResult) else await self._send(planned)

    async def _send(self, request: ManagementRequest, lock_ids: list[str] | None = None) -> ActionResult:
        # Locks are always taken in sorted id order, so two multi-lock callers cannot deadlock.
        ids = sorted(lock_ids or [request.session.session_id])
        async with contextlib.AsyncExitStack() as stack:
            for sid in ids:
                await stack.enter_async_context(self._locks.setdefault(sid, asyncio.Lock()))
            started = time.perf_counter()
            try:
                client = self.client.with_options(timeout=request.timeout_s, max_retries=0)
                reply = await asyncio.wait_for(
                    client.chat.completions.create(**request.create_kwargs(self.model)), request.timeout_s
                )
            except Exception as exc:  # any failure: a lifecycle action must never fail the agent
                return self._failed(request, exc, started)
            return self._succeeded(request, reply, started)


def _unsent(session: Session, error: ValueError, started: float) -> ActionResult:
    logger.warning("agent_hint context change for session %s not sent: %s", session.session_id, error)
    return ActionResult(
        ok=False,
        action="evict",
        target="",
        session_id=session.session_id,
        error=str(error),
        sent=False,
        elapsed_s=time.perf_counter() - started,
    )


def _describe(error: BaseException) -> str:
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        return "timed out"
    return f"{type(error).__name__}: {error}"
