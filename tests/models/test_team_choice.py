"""team_choice.py: the chooser probes the other way every probe_every-th step, keeps the way whose measured wall
times are lower (in either direction, under noise), does not flip back and forth at a modest gap under a loaded
machine's noise, compares a probe with the current way's recent steps (not its whole history), and a probe with
too little of its batch size to compare with does not count."""

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
    ways = _run(fast_team, 0.010, 0.012, 600, seed=1, rows=(8, 8, 1))  # probes land on both sizes
    assert fast_team.team and sum(ways[-200:]) >= 190
    slow_team = TeamChooser(start_team=start_team)  # a loaded machine: the team 0.5x, each step 0.7-1.4x its median
    ways = _run(slow_team, 0.020, 0.010, 600, seed=2, rows=(8, 8, 1), noise=(0.7, 1.4))
    assert not slow_team.team and sum(ways[-200:]) <= 10  # every 32nd step probes the team


@pytest.mark.parametrize("seed", range(4))
def test_a_modest_gap_under_load_noise_does_not_flip_back_and_forth(seed):
    """The team 1.2x faster, each step U(0.7, 1.4) of its way's time (review_decode2b's simulation): with no margin
    (switch below 1.0, 3 probes) the chooser switched ~21 times in 5,000 steps and spent ~24% of them on the slower
    way; margin 0.85 over 5 probes keeps it to a few switches and the probes' own share."""
    chooser = TeamChooser()
    ways = _run(chooser, 0.010, 0.012, 5000, seed=seed, noise=(0.7, 1.4))
    assert chooser.num_switches <= 8
    assert sum(not team for team in ways[-2000:]) <= 0.2 * 2000


def test_the_yardstick_follows_the_current_way_recent_steps():
    """Both ways 2x faster halfway (the machine's load dropped), the team still 1.2x slower: a probe must be
    compared with the regions' last `window` steps, not their whole history (whose median would stay at the old
    speed for as many steps again and make the team look 1.7x faster)."""
    chooser = TeamChooser()
    _run(chooser, 0.024, 0.020, 1000, seed=3, noise=(0.95, 1.05))
    _run(chooser, 0.012, 0.010, 1000, seed=4, noise=(0.95, 1.05))
    assert not chooser.team and chooser.num_switches == 0


def test_a_switch_starts_the_evidence_afresh():
    """After a switch the yardstick is the new way's times alone: a regions probe right after the switch to the team
    (one team step so far: no yardstick yet) does not count, though the regions' old times would make it look faster."""
    chooser = TeamChooser(probe_every=2, probes=1, window=4)
    for _ in range(4):  # regions 1.0, team probes 0.5: it switches to the team
        team = chooser.use_team(8)
        chooser.record(8, team, 0.5 if team else 1.0)
    assert chooser.team and chooser.num_switches == 1
    for seconds in (4.0, 0.6):  # the team's first step (slow), then a regions probe
        team = chooser.use_team(8)
        chooser.record(8, team, seconds)
    assert not team  # the second was the probe; against the regions' old 1.0s it would switch back
    assert chooser.team and chooser.num_switches == 1


def test_a_probe_without_a_yardstick_of_its_batch_size_does_not_count():
    chooser = TeamChooser(probe_every=2, probes=1)
    for rows in range(1, 40):  # every step a new batch size: no probe has the regions' times at its size
        team = chooser.use_team(rows)
        chooser.record(rows, team, 0.001 if team else 1.0)
    assert not chooser.team and chooser.num_switches == 0
    one = TeamChooser(probe_every=2, probes=1)  # one regions step is not a yardstick: the probe after it is ignored
    for team_s in (None, 0.001):
        team = one.use_team(8)
        one.record(8, team, 1.0 if team_s is None else team_s)
    assert not one.team and one.num_switches == 0
    with pytest.raises(ValueError):
        TeamChooser(probe_every=1)
    with pytest.raises(ValueError):
        TeamChooser(margin=1.5)
