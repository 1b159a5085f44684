"""bench/idle_wait.py: a comparison's next sample waits until every server's process group is at rest."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from hintkv.bench import idle_wait
from hintkv.bench.idle_wait import _at_rest, group_cpu_s, wait_idle

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# busy for `spin` seconds of wall clock (a spinning peer), then marks the file and sleeps
CHILD = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
open(sys.argv[2], "w").close()
time.sleep(60)
"""


def _child(spin_s: float, mark) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(spin_s), str(mark)], start_new_session=True)


def test_it_waits_through_a_peers_spin_and_not_for_a_resting_one(tmp_path):
    busy, rest = _child(1.5, tmp_path / "busy"), _child(0.0, tmp_path / "rest")
    try:
        while not (tmp_path / "rest").exists():  # the resting child's start-up is done
            asyncio.run(asyncio.sleep(0.05))
        waited, idle = asyncio.run(wait_idle([busy.pid, rest.pid], min_s=0.05, max_s=60, max_busy=0.05))
        assert idle and (tmp_path / "busy").exists()  # at rest only once the spin was over
        assert group_cpu_s(busy.pid) > group_cpu_s(rest.pid)
        waited, idle = asyncio.run(wait_idle([rest.pid], min_s=0.3, max_s=60))
        assert idle and waited >= 0.3  # min_s is always waited
    finally:
        busy.kill(), rest.kill()


def test_a_peer_that_never_rests_is_waited_for_at_most_max_s(tmp_path, monkeypatch):
    """It gives up in the first window that ends past max_s: windows are counted (each reads the group's ticks at
    its start and end), not timed: a loaded machine stretches every sleep (the old bound, max_s plus one window
    plus 0.3 s of wall clock, failed whenever the loop woke 0.3 s late)."""
    reads: list[int] = []
    ticks = idle_wait._group_ticks
    monkeypatch.setattr(idle_wait, "_group_ticks", lambda pgid: (reads.append(pgid), ticks(pgid))[1])
    busy = _child(600.0, tmp_path / "busy")
    try:
        waited, idle = asyncio.run(wait_idle([busy.pid], min_s=0.0, max_s=0.5, window_s=0.2, max_busy=0.05))
        assert not idle and waited >= 0.5
        assert len(reads) // 2 <= 3  # windows of at least 0.2 s each: the third ends past 0.5 s
    finally:
        busy.kill()


def test_no_groups_are_at_rest():
    assert asyncio.run(wait_idle([], min_s=0.0))[1]


def test_rest_is_judged_in_whole_ticks_and_an_exit_or_a_runnable_thread_is_not_rest():
    assert _at_rest({1: 5}, {1: 7}, running=False, max_ticks=2)
    assert not _at_rest({1: 5}, {1: 8}, running=False, max_ticks=2)
    assert not _at_rest({1: 5}, {1: 5}, running=True, max_ticks=2)  # a yield-spinner on a loaded machine
    assert not _at_rest({1: 5, 2: 9}, {1: 5}, running=False, max_ticks=2)  # 2 exited, its ticks gone with it
    assert _at_rest({1: 5}, {1: 5, 3: 1}, running=False, max_ticks=2)  # a new process's ticks count whole
