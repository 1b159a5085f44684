"""N users over a folder of traces: which user runs which traces, when it starts. Seeded.

    wl = build_workload("swe-agent", "/work/shared/traces/swe-agent", users=10, seed=0)

Kinds: `claude-code` (one recorded session a task, sub-agents included), `swe-agent` (one agent
a task) and `swe-team` (a leader and 2-4 teammates a task, `traces.team_task`). Traces are dealt
from a seeded shuffle, user by user; when the folder runs out they are dealt again with a new
salt, so a repeat is a distinct conversation to the prefix cache (never a free hit). Users start
uniformly within `stagger_s` (trace seconds) and run `tasks_per_user` tasks back to back.
"""

from __future__ import annotations

import random
from pathlib import Path

from hintkv.workload.program import Task, User, Workload
from hintkv.workload.traces import (
    DEFAULT_SCALE,
    Scale,
    load_claude_code,
    load_swe_agent,
    team_task,
)
from hintkv.workload.traces.swe_agent import Encode

KINDS = ("claude-code", "swe-agent", "swe-team")


def build_workload(kind: str, folder: str | Path, users: int, *, tasks_per_user: int = 1, scale: Scale = DEFAULT_SCALE,
                   seed: int = 0, stagger_s: float = 30.0, encode: Encode | None = None) -> Workload:
    if kind not in KINDS:
        raise ValueError(f"unknown workload kind {kind!r}; known: {', '.join(KINDS)}")
    if users < 1 or tasks_per_user < 1:
        raise ValueError("users and tasks_per_user must be >= 1")
    rng = random.Random(seed)
    traces = load_claude_code(folder) if kind == "claude-code" else load_swe_agent(folder)
    order = list(range(len(traces)))
    rng.shuffle(order)
    dealt = 0

    def deal():  # -> (the next trace, its salt)
        nonlocal dealt
        rnd, i = divmod(dealt, len(order))
        dealt += 1
        return traces[order[i]], (f"r{rnd}" if rnd else "")

    out = []
    for u in range(users):
        tasks: list[Task] = []
        for j in range(tasks_per_user):
            task_id = f"u{u}-t{j}"
            if kind == "swe-team":
                leader, salt = deal()
                mates = [deal()[0] for _ in range(rng.randint(2, 4))]
                tasks.append(team_task(task_id, leader, mates, scale, encode, salt))
            elif kind == "swe-agent":
                run, salt = deal()
                tasks.append(run.task(task_id, scale, encode, salt))
            else:
                session, salt = deal()
                tasks.append(session.task(task_id, scale, salt))
        out.append(User(f"u{u}", rng.uniform(0.0, stagger_s) if u else 0.0, tuple(tasks)))
    meta = {"kind": kind, "folder": str(folder), "users": users, "tasks_per_user": tasks_per_user,
            "token_scale": scale.token_scale, "max_calls": scale.max_calls, "seed": seed, "stagger_s": stagger_s}
    return Workload(kind, tuple(out), meta)
