"""team_choice.py: the chooser probes the other way every probe_every-th step, keeps the way whose measured wall
times are lower (in either direction, under noise), and a probe with nothing of its batch size to compare with
does not count."""

from __future__ import annotations

import random

import pytest

from hintkv.models.team_choice import TeamChooser


def _run(chooser: TeamChooser, team_s: float, regions_s: float, steps: int, seed: int, rows=(8,),
         noise=(0.9, 1.1)) -> list[bool]:
    rng, ways = random.Random(seed), []
    for i in range(steps):
        n = rows[i % len(rows)]
        team = chooser.use_team(n)
        ways.append(team)
        chooser.record(n, team, (team_s if team else regions_s) * n * rng.uniform(*noise))
    return ways


@pytest.mark.parametrize("start_team", [False, True])
def test_it_keeps_the_faster_way_whichever_it_starts_with(start_team):
    fast_team = TeamChooser(start_team=start_team)  # free cores: the team 1.2x, +-10% per step
    ways = _run(fast_team, 0.010, 0.012, 400, seed=1, rows=(8, 1))
    assert fast_team.team and sum(ways[-200:]) >= 190
    slow_team = TeamChooser(start_team=start_team)  # a loaded machine: the team 0.5x, each step 0.7-1.4x its median
    ways = _run(slow_team, 0.020, 0.010, 400, seed=2, rows=(8, 1), noise=(0.7, 1.4))
    assert not slow_team.team and sum(ways[-200:]) <= 10  # every 32nd step probes the team


def test_a_probe_without_a_yardstick_of_its_batch_size_does_not_count():
    chooser = TeamChooser(probe_every=2, probes=1)
    for rows in range(1, 40):  # every step a new batch size: no probe has the regions' times at its size
        team = chooser.use_team(rows)
        chooser.record(rows, team, 0.001 if team else 1.0)
    assert not chooser.team and chooser.num_switches == 0
    with pytest.raises(ValueError):
        TeamChooser(probe_every=1)
