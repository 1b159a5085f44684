"""The simulator's workload: the real traces as `hintkv.workload.program` users and tasks.

    wl = build_workload(["/work/shared/traces/claude-code", "/work/shared/traces/swe-agent"],
                        users=10, seed=0, token_scale=1.0)

Every trace of the folders becomes one task (claude-code sessions with their sub-agents; a
swe-agent run as one agent per task, the SWE-bench setting), loaded by `hintkv.workload.traces`.
The tasks are shuffled by the seed and dealt to the users round-robin (with more users than
traces, traces are reused under a fresh salt, so every task is a distinct conversation); users
start staggered over `stagger_s` seconds (seeded) and run their tasks back to back.
"""

from __future__ import annotations

import random
from pathlib import Path

from hintkv.workload.program import Task, User, Workload
from hintkv.workload.traces import Scale, claude_code, load_claude_code, load_swe_agent, swe_agent, trace_files

DEFAULT_TRACES = ("/work/shared/traces/claude-code", "/work/shared/traces/swe-agent")


def trace_kind(folder: Path) -> str:
    names = [p.name for p in folder.iterdir()]
    return "swe-agent" if any(".traj.json" in n for n in names) else "claude-code"


def source_files(folder: str | Path) -> list[Path]:
    """The trace files `build_workload` reads from `folder` (its loader's own suffixes)."""
    folder = Path(folder)
    loader = swe_agent if trace_kind(folder) == "swe-agent" else claude_code
    return trace_files(folder, loader.SUFFIXES)


def build_workload(folders: list[str] | tuple[str, ...], users: int, seed: int = 0, token_scale: float = 1.0,
                   max_calls: int | None = None, max_tasks: int | None = None,
                   stagger_s: float = 60.0, encode=None) -> Workload:
    if users < 1:
        raise ValueError("users must be >= 1")
    scale = Scale(token_scale, max_calls)
    sources: list[tuple[str, object]] = []
    for f in folders:
        folder = Path(f)
        if trace_kind(folder) == "swe-agent":
            sources += [("swe-agent", r) for r in load_swe_agent(folder)]
        else:
            sources += [("claude-code", s) for s in load_claude_code(folder)]
    rng = random.Random(seed)
    rng.shuffle(sources)
    n_tasks = max(len(sources), users) if max_tasks is None else max_tasks
    tasks: list[list[Task]] = [[] for _ in range(users)]
    encoded: dict[str, list[int]] = {}  # swe-agent texts encoded once for every salt (`SweAgentRun.task`)
    for i in range(n_tasks):
        kind, src = sources[i % len(sources)]
        tid = f"u{i % users}-t{len(tasks[i % users])}"
        salt = f"{seed}:{i // len(sources)}"
        if kind == "swe-agent":
            task = src.task(tid, scale, encode=encode, salt=salt, encoded=encoded)
        else:
            task = src.task(tid, scale, salt=salt)
        tasks[i % users].append(task)
    starts = sorted(rng.uniform(0, stagger_s) for _ in range(users))
    return Workload("traces", tuple(User(f"u{u}", starts[u], tuple(tasks[u])) for u in range(users)),
                    {"folders": list(folders), "users": users, "seed": seed, "token_scale": token_scale,
                     "max_calls": max_calls, "tasks": n_tasks})
