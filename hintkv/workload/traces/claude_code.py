"""Claude Code sessions (kv-cache-tester format): hash ids become deterministic token blocks.

Each hash id is one 64-token block of the prompt (the last one may be partial); ids are local to
a file, so a block's tokens are drawn from a generator seeded by (file, salt, id): equal ids at
equal positions give equal tokens, and prefix reuse is exactly as recorded. With a token scale
`f`, a block is round(64 f) tokens (at least one) and a prompt is round(in f) tokens: cut, or
completed by tokens unique to the call where `in` runs past the hashed blocks.

Timing: after call k an agent waits the next call's `think_time` (tool execution; the first call
has none). A sub-agent entry between calls k and k+1 of its parent starts at its recorded time,
measured from the end of call k (`t + api_time`), as a child session (`{task}_sub_{agent_id}`);
the parent's next call waits for its tool time AND for those sub-agents to end. A call whose
prompt no longer extends the previous one's (the context was compressed or rewritten) carries
`stale_from`: the first token of the previous prompt that is not reused.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hintkv.workload.program import AgentScript, Call, Spawn, Task
from hintkv.workload.token_ids import shared
from hintkv.workload.traces.files import (
    DEFAULT_SCALE,
    Scale,
    read_json,
    trace_files,
    trace_name,
)

TRACE_BLOCK = 64  # tokens per hash id in these traces
TOKEN_LOW, TOKEN_HIGH = 1000, 49000  # drawn ids avoid special tokens and fit SmolLM2's vocabulary


@dataclass(frozen=True, slots=True)
class ClaudeCodeSession:
    name: str  # file name without suffixes
    data: dict[str, Any]

    @property
    def requests(self) -> list[dict]:
        return self.data["requests"]

    def num_subagents(self) -> int:
        return sum(1 for r in self.requests if r.get("type") == "subagent")

    def task(self, task_id: str, scale: Scale = DEFAULT_SCALE, salt: str = "") -> Task:
        blocks = _Blocks(f"{self.name}:{salt}", scale.tokens(TRACE_BLOCK))
        return Task(task_id, self.name, _agent(task_id, "main", task_id, self.requests, blocks, scale))


SUFFIXES = (".json",)  # the trace files this loader reads (+ .gz)


def load_claude_code(folder: str | Path) -> list[ClaudeCodeSession]:
    return [ClaudeCodeSession(trace_name(p), read_json(p)) for p in trace_files(folder, SUFFIXES)]


class _Blocks:
    """Token ids of a hash id, drawn once per id from SHAKE-128 of (seed, id).

    `many` draws a call's new ids in one numpy pass (the whole trace set draws ~560K blocks of
    64 tokens: a Python loop per token was most of the workload's load time); the values are
    those of `TOKEN_LOW + v % span` over the digest read as native uint16, as before."""

    def __init__(self, seed: str, size: int) -> None:
        self.seed = seed.encode() + b":"
        self.size = size
        self._memo: dict[int, tuple[int, ...]] = {}

    def __getitem__(self, hid: int) -> tuple[int, ...]:
        return self.many([hid])[0]

    def many(self, hids: list[int]) -> list[tuple[int, ...]]:
        memo = self._memo
        todo = [h for h in dict.fromkeys(hids) if h not in memo]
        if todo:
            n, seed = 2 * self.size, self.seed
            raw = b"".join(hashlib.shake_128(seed + str(h).encode()).digest(n) for h in todo)
            memo.update(zip(todo, zip(*[iter(_tokens(raw))] * self.size)))
        return [memo[h] for h in hids]

    def tail(self, key: str, n: int) -> tuple[int, ...]:
        """`n` tokens no other prompt has: the unhashed rest of a prompt past its last full block."""
        return tuple(_tokens(hashlib.shake_128(self.seed + b"tail:" + key.encode()).digest(2 * n)))


def _tokens(raw: bytes) -> list[int]:
    """Token ids in [TOKEN_LOW, TOKEN_HIGH) from a digest read as native uint16 values (shared ints)."""
    return shared(np.frombuffer(raw, dtype=np.uint16) % (TOKEN_HIGH - TOKEN_LOW) + TOKEN_LOW)


def _agent(session_id: str, local_id: str, task_id: str, requests: list[dict], blocks: _Blocks,
           scale: Scale) -> AgentScript:
    calls: list[dict] = []  # per call: the request and the sub-agent entries after it
    pending_subs: list[dict] = []
    for r in requests:
        if r.get("type") == "subagent":
            (calls[-1]["subs"] if calls else pending_subs).append(r)
        else:
            calls.append({"req": r, "subs": []})
    if not calls:
        raise ValueError(f"{session_id}: a session without model calls")
    calls[0]["subs"][:0] = pending_subs  # sub-agents before the first call start after it
    if scale.max_calls is not None:
        calls = calls[:scale.max_calls]
    out: list[Call] = []
    prev_ids: list[int] = []
    prev_chunks: list[tuple[int, ...]] = []
    for k, c in enumerate(calls):
        r = c["req"]
        ids = r["hash_ids"]
        common = common_prefix(prev_ids, ids)
        stale_from = None
        if k and common < len(prev_ids) - 1:  # more than the (partial) last block changed
            stale_from = common * blocks.size
        chunks = prev_chunks[:common] + blocks.many(ids[common:])
        want = scale.tokens(r["in"])
        prompt = _cut(chunks, blocks.size, want)
        have = len(chunks) * blocks.size
        if want > have:  # `in` counts tokens after the last hashed block: unique to this call
            prompt += (blocks.tail(f"{local_id}:{k}", want - have),)
        prev_ids, prev_chunks = ids, chunks
        end_s = r["t"] + (r.get("api_time") or 0.0)
        spawns = tuple(
            Spawn(max(0.0, s["t"] - end_s) if k or s not in pending_subs else 0.0,
                  _agent(f"{task_id}_sub_{s['agent_id']}", s["agent_id"], task_id, s["requests"], blocks, scale))
            for s in c["subs"] if any(x.get("type") != "subagent" for x in s["requests"]))
        wait = float(calls[k + 1]["req"].get("think_time") or 0.0) if k + 1 < len(calls) else 0.0
        out.append(Call(prompt, scale.tokens(r["out"]), wait, spawns, stale_from))
    return AgentScript(session_id, tuple(out))


def _cut(chunks: list[tuple[int, ...]], size: int, n: int) -> tuple[tuple[int, ...], ...]:
    """The first `n` tokens of `chunks` (all `size` long), still in chunks."""
    full, rest = divmod(n, size)
    out = chunks[:full]
    if rest and full < len(chunks):
        out.append(chunks[full][:rest])
    return tuple(out)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (binary search on slices)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
