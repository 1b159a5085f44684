"""bench/spec_decode: the goal is computed from the runs (the best mode whose greedy output is
identical), and the agent turns are real swe-agent prompts that grow turn by turn."""

import os
from pathlib import Path

import pytest
import torch

from hintkv.bench.spec_decode import (
    ModeFigures,
    agent_turns,
    make_engine,
    spec_goal,
    spread,
    summarize,
)
from hintkv.bench.swarm import default_traces

TRACES = Path(default_traces())


def test_goal_reads_the_best_identical_mode():
    base = ModeFigures(tokens=100, decode_s=10.0, decode_cpu_s=8.0, forwards=100, outputs=[[1, 2, 3]],
                       per_turn=[(50, 5.0, 50), (50, 5.0, 50)])
    fast_wrong = ModeFigures(tokens=100, decode_s=2.0, forwards=20, drafts=100, accepted=80, outputs=[[1, 2, 4]],
                             per_turn=[(50, 1.0, 10), (50, 1.0, 10)])
    ok = ModeFigures(tokens=100, decode_s=5.0, decode_cpu_s=3.2, forwards=50, drafts=80, accepted=50,
                     outputs=[[1, 2, 3]],
                     per_turn=[(50, 2.0, 20), (50, 3.0, 30)])
    rows, modes = summarize({None: base, "ngram": fast_wrong, "suffix": ok}, 4)
    assert [r["identical"] for r in rows] == [True, False, True]
    assert modes["suffix"]["speedup"] == pytest.approx(2.0)
    assert modes["suffix"]["speedup_cpu_time"] == pytest.approx(2.5) and rows[2]["vs none (CPU)"] == pytest.approx(2.5)
    assert rows[2]["k"] == "<=4 adaptive" and rows[0]["k"] == 0
    assert summarize({None: base, "suffix": ok}, 4, "fixed")[0][1]["k"] == "4"
    assert modes["suffix"]["tokens_per_forward"] == 2.0 and modes["suffix"]["acceptance"] == 50 / 80
    # per turn: 25 vs 10 tok/s and 16.7 vs 10 tok/s
    assert modes["suffix"]["speedup_per_turn"] == [2.5, pytest.approx(1.667)]
    assert modes["suffix"]["speedup_min_median_max"] == [pytest.approx(1.667), pytest.approx(2.083, abs=1e-3), 2.5]
    assert modes["suffix"]["tokens_per_forward_per_turn"] == [2.5, pytest.approx(1.667)]
    assert rows[2]["per-turn min/med/max"] == "1.67/2.08/2.50" and rows[0]["per-turn min/med/max"] == "-"
    g = spec_goal(modes)
    assert g == {"target": 1.8, "measured": pytest.approx(2.0), "met": True, "mode": "suffix",
                 "per_turn_min_median_max": modes["suffix"]["speedup_min_median_max"], "turns": 2,
                 "cpu_time": pytest.approx(2.5)}
    ok.decode_s = 8.0
    assert spec_goal(summarize({None: base, "ngram": fast_wrong, "suffix": ok}, 4)[1])["met"] is False


@pytest.mark.skipif(not (TRACES / "swe-agent").is_dir(), reason="no swe-agent traces here")
def test_agent_turns_are_a_growing_trajectory():
    turns = agent_turns(str(TRACES), 1, 2, 2048, seed=0)
    assert len(turns) == 2 and turns[0].trace == turns[1].trace
    a, b = turns[0].prompt, turns[1].prompt
    assert len(b) > len(a) and b[:len(a) - 3] == a[:len(a) - 3]  # the next turn extends the trajectory


def test_spread_picks_evenly_and_ends_with_the_last():
    assert spread(10, 2) == [4, 9]
    assert spread(8, 4) == [1, 3, 5, 7]
    assert spread(3, 3) == [0, 1, 2]
    assert spread(2, 3) == []


@pytest.mark.skipif(not (TRACES / "swe-agent").is_dir(), reason="no swe-agent traces here")
def test_agent_turns_end_with_the_last_turn_that_fits():
    turns = agent_turns(str(TRACES), 2, 2, 2048, seed=1)
    for name in {t.trace for t in turns}:
        mine = [t for t in turns if t.trace == name]
        assert len(mine) == 2 and all(len(t.prompt) <= 2048 for t in mine)
        assert mine[1].index > mine[0].index > 0  # later turns, not the first two


def test_every_mode_takes_its_greedy_tokens_from_the_logits(monkeypatch):
    """identical_greedy compares like with like: no mode's engine answers greedy steps with the screened head
    (it would serve no speculation while drafts are verified on the logits), and the environment is restored."""
    monkeypatch.delenv("HINTKV_GREEDY_HEAD", raising=False)
    engine = make_engine(None, 4, 1024, model="dummy:tiny")
    model = engine.runner.model
    assert model.greedy_tokens(torch.randn(2, model.config.hidden_size)) is None
    assert "HINTKV_GREEDY_HEAD" not in os.environ
    engine.close()
