"""Waiting until the servers of a comparison are at rest before the next sample.

    group_cpu_s(pgid) -> s                 CPU time (user + system) of every process in process group pgid
    wait_idle(pgids, ...) -> (waited_s, idle)   sleep at least `min_s`, then until every group is at rest over
                                           a `window_s` (none of it runnable at the end, no process exited,
                                           at most `max_busy` of one CPU in whole ticks), or `max_s` passed

A server may keep a CPU busy after it answered: vLLM's CPU worker polls its shared-memory queue with
`sched_yield` for `busy_loop_s` = 1 s after its last read (vllm/distributed/device_communicators/
shm_broadcast.py, SpinCondition.wait). Measured (sixteenth session): 630-880 ms of CPU in the 1.5 s after
a 512-token request, against 0.4 ms for hintkv's server. `bench engine` paused a fixed 0.3 s between
two servers' samples, so the sample that followed vLLM's shared the 2 cores with that spin (a 2-thread
prefill waits at every barrier for the thread that shares its core). Each server runs in its own process
group (`ServerProcess`: start_new_session), which holds its workers too (vLLM's EngineCore and Worker).
Linux only (/proc); elsewhere nothing is measured and only `min_s` is waited.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _group_ticks(pgid: int) -> tuple[dict[int, int], bool]:
    """Each live process of group `pgid`: its user + system clock ticks; and whether any of it is runnable
    (state R: a `sched_yield` spinner always is, however little CPU a loaded machine gives it)."""
    ticks, running = {}, False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return ticks, running
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        if int(fields[2]) != pgid:  # field 5, pgrp
            continue
        ticks[int(entry)] = int(fields[11]) + int(fields[12])  # utime, stime
        running = running or _any_thread_running(entry)
    return ticks, running


def _any_thread_running(pid: str) -> bool:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] == "R":
            return True
    return False


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes of process group `pgid` (their threads included)."""
    return sum(_group_ticks(pgid)[0].values()) * _TICK_S


def _at_rest(before: dict[int, int], after: dict[int, int], running: bool, max_ticks: float) -> bool:
    """A group is at rest over a window when none of it is runnable at its end, no process of it exited
    (an exit takes its ticks along: it would read as idle) and it used at most `max_ticks` whole ticks."""
    if running or not before.keys() <= after.keys():
        return False
    return sum(after[p] - before.get(p, 0) for p in after) <= max_ticks


async def wait_idle(pgids: Iterable[int], *, min_s: float = 0.3, max_s: float = 3.0, window_s: float = 0.2,
                    max_busy: float = 0.1) -> tuple[float, bool]:
    """Sleep `min_s`, then until each group in `pgids` is at rest over one `window_s` (`_at_rest`: nothing
    runnable at its end, no exit, and at most `max_busy` of one CPU, in whole clock ticks), at most `max_s`
    in all; (seconds waited, whether they came to rest)."""
    groups = list(pgids)
    t0 = time.monotonic()
    await asyncio.sleep(min_s)
    if not groups or not os.path.isdir("/proc"):
        return time.monotonic() - t0, True
    max_ticks = int(max_busy * window_s / _TICK_S)  # whole ticks: 0.1 CPU over 0.2 s is 2 ticks at 100 Hz
    while True:
        before = [_group_ticks(g)[0] for g in groups]
        await asyncio.sleep(window_s)
        after = [_group_ticks(g) for g in groups]
        if all(_at_rest(b, a, running, max_ticks) for b, (a, running) in zip(before, after)):
            return time.monotonic() - t0, True
        if time.monotonic() - t0 >= max_s:
            return time.monotonic() - t0, False
