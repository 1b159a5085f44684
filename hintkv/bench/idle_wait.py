"""Waiting until the servers of a comparison are at rest before the next sample.

    group_cpu_s(pgid) -> s                 CPU time (user + system) of every process in process group pgid
    wait_idle(pgids, ...) -> (waited_s, idle)   sleep at least `min_s`, then until every group used less
                                           than `max_busy` of one CPU over a `window_s`, or `max_s` passed

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


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes of process group `pgid` (their threads included)."""
    total = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0.0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        if int(fields[2]) == pgid:  # field 5, pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total * _TICK_S


async def wait_idle(pgids: Iterable[int], *, min_s: float = 0.3, max_s: float = 3.0, window_s: float = 0.2,
                    max_busy: float = 0.1) -> tuple[float, bool]:
    """Sleep `min_s`, then until each group in `pgids` used under `max_busy` of one CPU over one `window_s`
    (at most `max_s` in all); (seconds waited, whether they came to rest)."""
    groups = list(pgids)
    t0 = time.monotonic()
    await asyncio.sleep(min_s)
    if not groups or not os.path.isdir("/proc"):
        return time.monotonic() - t0, True
    while True:
        before = [group_cpu_s(g) for g in groups]
        await asyncio.sleep(window_s)
        used = [group_cpu_s(g) - b for g, b in zip(groups, before)]
        if all(u < max_busy * window_s for u in used):
            return time.monotonic() - t0, True
        if time.monotonic() - t0 >= max_s:
            return time.monotonic() - t0, False
