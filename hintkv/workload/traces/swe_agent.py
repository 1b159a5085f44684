"""mini-swe-agent trajectories (format "mini-swe-agent-1.1"): real text, real tool times.

A call is one assistant turn: its prompt is every message before it rendered as ChatML
(`<|im_start|>role\\ncontent<|im_end|>\\n`, an assistant's tool call as its JSON arguments after
the text) plus the assistant header, tokenized message by message with the caller's `encode`
(SmolLM2's tokenizer by default), so consecutive calls share their prefix exactly. With a token
scale `f`, every message keeps its first ceil(n f) tokens. Output length is the recorded
`completion_tokens` x f; tool time is the tool message's timestamp minus the assistant's.

Two shapes: `SweAgentRun.task` is one agent per task (the SWE-bench setting); `team_task` is a
leader with a task that plans (its run's first calls), starts 2-4 teammates that each replay a
real run under the leader's system prompt and task, waits for them, and merges their answers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hintkv.workload.program import AgentScript, Call, Spawn, Task
from hintkv.workload.traces.files import (
    DEFAULT_SCALE,
    Scale,
    read_json,
    trace_files,
    trace_name,
)

Encode = Callable[[list[str]], list[list[int]]]  # texts -> their token ids (a batch)
PLAN_CALLS = 2  # calls a team leader makes before starting its teammates
SUMMARY_TOKENS = 256  # (before scaling) of a teammate's last answer that goes back to the leader


@dataclass(frozen=True, slots=True)
class Turn:
    """One message, as what the prompt and the timeline need."""

    role: str
    text: str
    timestamp: float | None
    completion_tokens: int | None  # assistant turns: usage.completion_tokens


@dataclass(frozen=True, slots=True)
class SweAgentRun:
    name: str
    turns: tuple[Turn, ...]

    @property
    def num_calls(self) -> int:
        return sum(1 for t in self.turns if t.role == "assistant")

    def task(self, task_id: str, scale: Scale = DEFAULT_SCALE, encode: Encode | None = None, salt: str = "",
             encoded: dict[str, list[int]] | None = None) -> Task:
        """`encoded`: text -> its token ids, shared between the tasks built with one `encode` (a
        run dealt again under another salt differs only in its system message: the rest is not
        encoded again; a 1000-user simulation encoded each run ~7 times)."""
        r = _Renderer(encode or default_encode(), scale, salt, encoded)
        return Task(task_id, self.name, AgentScript(task_id, tuple(_calls(r, list(self.turns), scale))))


SUFFIXES = (".traj.json", ".json")  # the trace files this loader reads (+ .gz)


def load_swe_agent(folder: str | Path) -> list[SweAgentRun]:
    return [_parse(trace_name(p), read_json(p)) for p in trace_files(folder, SUFFIXES)]


def team_task(task_id: str, leader: SweAgentRun, teammates: list[SweAgentRun], scale: Scale = DEFAULT_SCALE,
              encode: Encode | None = None, salt: str = "") -> Task:
    """A leader/teammate swarm: the leader plans, starts `teammates` (each replays its run under
    the leader's system prompt and task), waits for all of them, then merges their answers."""
    if not 1 <= len(teammates) <= 8:
        raise ValueError("a team has 1-8 teammates")
    r = _Renderer(encode or default_encode(), scale, salt)
    head = list(leader.turns[:2])  # system + the task
    plan = _calls(r, list(leader.turns), Scale(scale.token_scale, PLAN_CALLS))
    subs = []
    answers = []
    for k, mate in enumerate(teammates):
        turns = head + [Turn("user", "Teammate assignment:\n" + mate.turns[1].text, None, None)] + list(mate.turns[2:])
        calls = _calls(r, turns, scale)
        subs.append(Spawn(0.0, AgentScript(f"{task_id}_sub_{k}", tuple(calls))))
        last = next((t.text for t in reversed(mate.turns) if t.role == "assistant"), "")
        answers.append(Turn("tool", last, None, None))
    plan_turns = list(leader.turns[:2 + 2 * len(plan)])  # what the leader saw while planning
    last = plan[-1]
    plan[-1] = Call(last.prompt, last.max_tokens, 0.0, tuple(subs), last.stale_from)
    merge_turns = plan_turns[:-1] + [Turn("assistant", "Starting teammates.", None, None)] + answers
    merge = Call(r.prompt(merge_turns), r.scale.tokens(plan[0].max_tokens / scale.token_scale), 0.0)
    return Task(task_id, f"team:{leader.name}+" + "+".join(m.name for m in teammates),
                AgentScript(task_id, tuple(plan) + (merge,)))


@lru_cache(maxsize=1)
def default_encode() -> Encode:
    from hintkv.models.presets import (
        smollm2_tokenizer,  # loads the real tokenizer (cached on disk)
    )

    backend = smollm2_tokenizer().backend
    return lambda texts: [e.ids for e in backend.encode_batch(list(texts), add_special_tokens=False)]


def _parse(name: str, data: dict[str, Any]) -> SweAgentRun:
    turns = []
    for m in data["messages"]:
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            continue  # "exit" closes the run: no call follows it
        text = m.get("content") or ""
        if not isinstance(text, str):
            text = json.dumps(text)
        for tc in m.get("tool_calls") or []:
            text += "\n" + json.dumps((tc.get("function") or {}).get("arguments", ""))
        extra = m.get("extra") or {}
        usage = ((extra.get("response") or {}).get("usage") or {}) if role == "assistant" else {}
        turns.append(Turn(role, text, extra.get("timestamp"), usage.get("completion_tokens")))
    if sum(1 for t in turns if t.role == "assistant") == 0:
        raise ValueError(f"{name}: a run without assistant turns")
    return SweAgentRun(name, tuple(turns))


class _Renderer:
    """ChatML token ids of message lists, one message encoded once."""

    def __init__(self, encode: Encode, scale: Scale, salt: str,
                 encoded: dict[str, list[int]] | None = None) -> None:
        self.encode = encode
        self.scale = scale
        self.salt = salt  # text-level: a salted run is a distinct conversation to a prefix cache
        self.encoded = {} if encoded is None else encoded  # text -> its ids (maybe shared: `task`)
        self._memo: dict[tuple[str, str], tuple[int, ...]] = {}
        self._frame: dict[str, list[int]] = {}
        self.header = tuple(encode(["<|im_start|>assistant\n"])[0])
        self.footer = encode(["<|im_end|>\n"])[0]

    def prepare(self, turns: list[Turn]) -> None:
        """Encode every message not seen yet, in one batch."""
        todo = list({(t.role, t.text): t for t in turns if (t.role, t.text) not in self._memo}.values())
        roles = [r for r in {t.role for t in todo} if r not in self._frame]
        for role, ids in zip(roles, self.encode([f"<|im_start|>{r}\n" for r in roles])):
            self._frame[role] = ids
        texts = [f"{self.salt}{t.text}" if t.role == "system" and self.salt else t.text for t in todo]
        new = list(dict.fromkeys(x for x in texts if x not in self.encoded))
        if new:
            self.encoded.update(zip(new, self.encode(new)))
        for t, text in zip(todo, texts):
            body = self.encoded[text]
            body = body[:math.ceil(len(body) * self.scale.token_scale)]
            self._memo[(t.role, t.text)] = tuple(self._frame[t.role] + body + self.footer)

    def message(self, t: Turn) -> tuple[int, ...]:
        ids = self._memo.get((t.role, t.text))
        if ids is None:
            self.prepare([t])
            ids = self._memo[(t.role, t.text)]
        return ids

    def prompt(self, turns: list[Turn]) -> tuple[tuple[int, ...], ...]:
        return (*(self.message(t) for t in turns), self.header)


def _calls(r: _Renderer, turns: list[Turn], scale: Scale) -> list[Call]:
    r.prepare(turns)
    calls: list[Call] = []
    for i, t in enumerate(turns):
        if t.role != "assistant":
            continue
        if scale.max_calls is not None and len(calls) == scale.max_calls:
            break
        nxt = turns[i + 1] if i + 1 < len(turns) else None
        wait = 0.0
        if nxt is not None and nxt.role == "tool" and nxt.timestamp and t.timestamp:
            wait = max(0.0, nxt.timestamp - t.timestamp)
        out = t.completion_tokens or max(1, len(t.text) // 4)
        calls.append(Call(r.prompt(turns[:i]), r.scale.tokens(out), wait, tool="bash"))
    if calls:
        last = calls[-1]
        calls[-1] = Call(last.prompt, last.max_tokens, 0.0, last.spawns, last.stale_from, None)
    return calls
