"""The accuracy benchmark's evaluation set and its bootstrap intervals (`bench/accuracy.py`)."""

from __future__ import annotations

import random

import torch

from hintkv.bench.accuracy import FIXED_TEXTS, compare, compare_all, eval_texts
from hintkv.models.calibration import CALIBRATION_TEXTS
from hintkv.models.loader import load_model


def test_the_evaluation_set_ships_and_is_not_the_calibration_set():
    texts = eval_texts()
    assert len(texts) >= 25 and sum(len(t) for _, t in texts) > 30_000
    assert all(src and t and not t.startswith("\n") and "%%%% text:" not in t for src, t in texts)
    assert len({t for _, t in texts}) == len(texts)
    for _, t in texts:
        assert all(t[:60] not in cal and cal[:60] not in t for cal in CALIBRATION_TEXTS)
        assert all(t[:60] not in ev for ev in FIXED_TEXTS)


def test_compare_all_runs_every_case_over_one_reference_pass_with_intervals():
    lm = load_model("dummy:tiny", torch.float32, "cpu")
    rng = random.Random(0)
    lists = [[rng.randrange(100, 5000) for _ in range(rng.randrange(6, 14))] for _ in range(10)]
    out = compare_all(lm.model, {"same": (lm.model, "auto", None), "int8": (lm.model, "int8", None),
                                 "steps": (lm.model, "int8", 3)}, lists)
    same, int8 = out["same"], out["int8"]
    assert same["top1_agreement"] == 1.0 and same["kl_per_token"] == 0.0
    assert same["top1_agreement_ci95"] == [1.0, 1.0] and same["kl_per_token_ci95"] == [0.0, 0.0]
    assert int8["tokens"] == sum(map(len, lists)) and int8["kl_per_token"] > 0
    for fig in out.values():
        for key in ("top1_agreement", "kl_per_token", "ppl_candidate", "ppl_reference"):
            lo, hi = fig[f"{key}_ci95"]
            assert lo <= fig[key] <= hi, (key, fig)
    lo, hi = int8["kl_per_token_ci95"]
    assert hi > lo  # texts differ, so resampling them moves the figure
    # one case alone gives the same figures (the shared reference pass changes nothing); < 8 texts: no interval
    alone = compare(lm.model, lm.model, lists, "int8")
    assert alone == int8
    assert "top1_agreement_ci95" not in compare(lm.model, lm.model, lists[:5], "int8")
