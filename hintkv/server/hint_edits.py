"""Applying a request's hint edits through the engine, and the `agent_hint_result` saying what was done.

    resolved edits --plan_edits--> CacheEdits (ranges -> first stale token) --engine.manage--> outcomes
                                                                              --> AgentHintResult

A session edit is one `CacheEdit(action)`. Range edits of one type (a messages and a tools edit
may come together) become ONE `CacheEdit(action, token_start)`: the first token whose KV is
stale once the earliest changed message and tool are gone (`stale_token_start`); the outcome is
reported on the first of those edits and the others point at it, so no block is counted twice.

Nothing here can make a request fail: a window the chat template cannot render, or an engine
error, turns the edits concerned into `skipped` with a note, and the reply is still a 200.
Rendering a long window and taking the engine's lock both happen in worker threads, never on
the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from hintkv.engine.client import EngineClient
from hintkv.engine.types import CacheEdit, EditOutcome
from hintkv.protocol import AgentHintResult, Edit, EditResult, TierCount
from hintkv.protocol.agent_hint import CompactEdit
from hintkv.protocol.ranges import Render, range_starts, stale_token_start
from hintkv.server.edit_notes import edit_notes
from hintkv.server.hints import RequestHint
from hintkv.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)

IGNORED_NOTE = "hints are ignored by this server (--ignore-hints): nothing was applied"
_REPORTED_ACTIONS = frozenset({"evicted", "offloaded", "prefetched", "none", "skipped"})


@dataclass(slots=True)
class PlannedEdit:
    """One resolved edit on its way to the engine."""

    edit: Edit
    cache_index: int | None = None  # which CacheEdit carries it; None: skipped
    reports: bool = True  # False: another edit of its range group reports the outcome
    token_start: int | None = None
    notes: list[str] = field(default_factory=list)


def plan_edits(
    edits: list[Edit], render: Render | None, messages: list[dict], tools: list[dict] | None
) -> tuple[list[PlannedEdit], list[CacheEdit]]:
    """Resolve edits to CacheEdits (may render the window: call it off the event loop)."""
    planned = [PlannedEdit(e) for e in edits]
    groups: dict[str, list[PlannedEdit]] = {}
    for p in planned:
        if p.edit.is_range:
            groups.setdefault(p.edit.type, []).append(p)
    starts: dict[str, int] = {}  # range action -> its stale range's first token
    for action, group in groups.items():
        try:
            token_starts = [p.edit.start for p in group if p.edit.target == "tokens"]
            if token_starts:  # /v1/completions: the positions are given (no window to render)
                starts[action] = min(token_starts)
            elif render is None:
                raise ValueError("this endpoint has no messages or tools to render")
            else:
                starts[action] = stale_token_start(render, messages, tools, *range_starts([p.edit for p in group]))
        except Exception as exc:  # noqa: BLE001  (unapplicable hint: report it, serve the request)
            for p in group:
                p.notes.append(f"could not find the stale tokens: {exc}")
    # the cache edits in the order the edits came: a range group's at its first edit's place
    cache_edits: list[CacheEdit] = []
    for p in planned:
        if not p.edit.is_range:
            p.cache_index = len(cache_edits)
            # compact's evict drops the session's own claim from its first token (`CompactEdit`)
            cache_edits.append(CacheEdit(p.edit.type, token_start=0 if isinstance(p.edit, CompactEdit) else None))
            continue
        group = groups[p.edit.type]
        if p is not group[0] or p.edit.type not in starts:
            continue
        start = starts[p.edit.type]
        for q in group:
            q.cache_index, q.token_start = len(cache_edits), start
            if q is not p:
                q.reports = False
                q.notes.append(
                    f"applied together with the {p.edit.target} {p.edit.type} edit "
                    f"[{p.edit.start}, {p.edit.end}) as one stale range"
                )
        cache_edits.append(CacheEdit(p.edit.type, token_start=start))
    return planned, cache_edits


async def apply_hint(
    engine: EngineClient,
    rh: RequestHint,
    *,
    enabled: bool,
    metrics: ServerMetrics,
    render: Render | None = None,
    messages: list[dict] | None = None,
    tools: list[dict] | None = None,
    executor: Executor | None = None,
) -> AgentHintResult:
    """Apply `rh.edits` for `rh.ref` (unless hints are disabled) and report, edit by edit.

    `executor`: where to render the window (None: asyncio's default threads); the engine takes
    its lock in its own management threads."""
    result = AgentHintResult(
        session_id=rh.hint.session_id,
        parent_session_id=rh.hint.parent_session_id,
        manage_request=rh.manage,
        notes=list(rh.hint.notes) if enabled else [],  # what the server changed in the hint it accepted
    )
    if not enabled:
        result.notes.append(IGNORED_NOTE)
        result.edits = [_result(PlannedEdit(e, notes=[IGNORED_NOTE]), None) for e in rh.edits]
    elif rh.edits:
        needs_render = any(e.is_range for e in rh.edits)
        args = (rh.edits, render, messages or [], tools)
        loop = asyncio.get_running_loop()
        planned, cache_edits = (
            await loop.run_in_executor(executor, plan_edits, *args)
            if needs_render
            else plan_edits(*args)
        )
        outcomes = await _manage(engine, rh, cache_edits)
        result.edits = [
            _result(p, outcomes[p.cache_index] if p.cache_index is not None else None)
            for p in planned
        ]
    for r in result.edits:
        metrics.hint_edits.labels(type=r.type, target=r.target, action=r.action).inc()
    return result


async def _manage(
    engine: EngineClient, rh: RequestHint, cache_edits: list[CacheEdit]
) -> list[EditOutcome]:
    if not cache_edits:
        return []
    try:
        outcomes = await engine.manage(rh.ref, cache_edits)
        if len(outcomes) != len(cache_edits):
            raise RuntimeError(f"{len(outcomes)} outcomes for {len(cache_edits)} edits")
        return outcomes
    except Exception as exc:  # hints never make a request fail
        logger.exception("applying agent_hint edits of session %s failed", rh.ref.session_id)
        return [EditOutcome("skipped", reason="engine_error", detail=str(exc)) for _ in cache_edits]


def _result(p: PlannedEdit, outcome: EditOutcome | None) -> EditResult:
    e = p.edit
    base = {"type": e.type, "target": e.target, "start": e.start, "end": e.end,
            "token_start": p.token_start}
    if outcome is None:
        return EditResult(**base, action="skipped", notes=p.notes)
    action = outcome.action if outcome.action in _REPORTED_ACTIONS else "none"
    notes = list(p.notes)
    if p.reports:
        notes += edit_notes(outcome)
        tiers = {t: TierCount(blocks=b, tokens=n) for t, (b, n) in outcome.tiers.items()}
    else:
        tiers = {}
    return EditResult(**base, action=action, tiers=tiers, notes=notes)


def chat_render(tokenizer: Any, template_kwargs: dict[str, Any] | None) -> Render:
    """Render a window as it sits in a session's KV: chat template, no generation prompt."""
    kwargs = dict(template_kwargs or {})

    def render(messages: list[dict], tools: list[dict] | None) -> list[int]:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=False, **kwargs
        )
        return tokenizer.encode(text)

    return render
