"""Per-agent gap sequences read straight from the agent traces: how long each real agent stayed
away between its model calls (tool execution, thinking), in seconds, in call order.

For benches that need sessions with a realistic history (`bench cache` seeds each session's gap
estimate by replaying a window of one agent's recorded gaps) without rendering any prompt.

    claude-code  a request's `think_time` (seconds the client spent before sending it), for the
                 main agent and each sub-agent (its own `requests` list)
    swe-agent    a tool message's timestamp minus the assistant message's before it
"""

from __future__ import annotations

from pathlib import Path

from hintkv.workload.traces.files import read_json, trace_files

DEFAULT_TRACES = Path("/work/shared/traces")


def _claude_code(requests: list[dict], out: list[list[float]]) -> None:
    gaps: list[float] = []
    calls = 0
    for r in requests:
        if r.get("type") == "subagent":
            _claude_code(r.get("requests") or [], out)
            continue
        if calls:
            gaps.append(max(0.0, float(r.get("think_time") or 0.0)))
        calls += 1
    if gaps:
        out.append(gaps)


def _swe_agent(messages: list[dict]) -> list[float]:
    gaps: list[float] = []
    last_done = None
    for m in messages:
        ts = m.get("extra", {}).get("timestamp") if isinstance(m.get("extra"), dict) else None
        ts = m.get("timestamp", ts)
        if ts is None:
            continue
        if m.get("role") == "assistant":
            last_done = float(ts)
        elif last_done is not None and m.get("role") in ("tool", "user"):
            gaps.append(max(0.0, float(ts) - last_done))
            last_done = None
    return gaps


def trace_gaps(root: str | Path = DEFAULT_TRACES) -> dict[str, list[list[float]]]:
    """Family -> one gap sequence per agent that made two calls or more (empty if absent)."""
    root = Path(root)
    out: dict[str, list[list[float]]] = {"claude-code": [], "swe-agent": []}
    if (root / "claude-code").is_dir():
        for p in trace_files(root / "claude-code"):
            _claude_code(read_json(p).get("requests") or [], out["claude-code"])
    if (root / "swe-agent").is_dir():
        for p in trace_files(root / "swe-agent", (".traj.json", ".json")):
            gaps = _swe_agent(read_json(p).get("messages") or [])
            if gaps:
                out["swe-agent"].append(gaps)
    return out
